"""Worlds by size: one warm world per (size, backend, options), all closed together."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from .world import World

W = TypeVar("W", bound=World)


class WorldPool(Generic[W]):
    """Keeps one running :class:`World` per configuration, so every test of a size shares it.

    Example::

        >>> import torch.distributed as dist
        >>> pool = WorldPool(timeout=30.0)
        >>> world = pool.get(2)          # started on first use, then reused
        >>> pool.get(2) is world, world.run(dist.get_world_size)
        (True, [2, 2])
        >>> pool.close()
    """

    def __init__(self, factory: type[W] = World, **world_options: Any) -> None:  # type: ignore[assignment]
        self._factory = factory
        self._options = world_options
        self._worlds: dict[tuple[int, str], W] = {}

    def get(self, size: int, backend: str | None = None, *, start: bool = True) -> W:
        """The running world of ``size`` ranks (started, or restarted after a failure);
        ``start=False`` hands it over as it is, for a caller whose first job starts it."""
        backend = backend or self._options.get("backend", "gloo")
        key = (size, backend)
        world = self._worlds.get(key)
        if world is None:
            options = {**self._options, "backend": backend}
            world = self._worlds[key] = self._factory(size, **options)
        if start:
            world.start()
        return world

    def worlds(self) -> list[W]:
        """Every world created so far."""
        return list(self._worlds.values())

    def close(self) -> None:
        """Stop every world's ranks."""
        for world in self._worlds.values():
            world.close()
        self._worlds.clear()
