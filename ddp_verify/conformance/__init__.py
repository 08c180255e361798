"""The conformance suite: torch's data-parallel machinery against single-process training.

Run it against the installed torch, or against a team's own DDP-like wrapper::

    pytest --pyargs ddp_verify.conformance --world-size 4
    pytest --pyargs ddp_verify.conformance --world-size 4 --ddp-wrapper my_team.parallel:MyDDP
    ddp-verify conformance --world-size 4

Each property draws scenarios (models, uneven per-rank batches, accumulation, optimizers) and
checks the trained parameters, gradients and losses against the reference; the checks that are
not about training (samplers, metric aggregation) compare with what one process computes on the
whole dataset. ``--conformance-examples N`` sets the scenarios per property (default 10).

Modules: ``test_ddp_options`` (bucket sizes, gradient_as_bucket_view, static_graph,
find_unused_parameters, broadcast_buffers, no_sync), ``test_comm_hooks`` (allreduce, fp16, bf16,
PowerSGD), ``test_zero`` (ZeroRedundancyOptimizer), ``test_join`` (uneven numbers of batches
under Join and model.join), ``test_data`` (DistributedSampler, metrics), ``test_fsdp``
(fully_shard), ``test_optimizers`` (torch.optim's rules, clip_grad_norm_ in every norm),
``test_differentiable_collectives`` (torch.distributed.nn's gradients), ``test_fused_optimizer``
(DDP's _register_fused_optim), ``test_model_averaging``
(PeriodicModelAverager, PostLocalSGDOptimizer, subgroups), ``test_surface`` (the surface
table of :mod:`.surface` against the installed torch's signatures: what the gate covers).
"""
