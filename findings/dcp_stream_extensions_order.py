"""FileSystemWriter(_extensions=[a, b]) (experimental stream extensions: compression,
encryption) wraps the output stream in a, then in b, so what is written passes through b's
transform first and a's last; it records the descriptors reversed, [b, a], and
FileSystemReader builds its transforms from that list in order, so b's inverse is applied
to the raw bytes first. Two extensions that commute (two XORs) load back; a byte sum and a
XOR do not: torch.load reads garbage ("Weights only load failed ... Unsupported operand").
Recording the descriptors in the writer's order (or wrapping in reverse) loads both.

    python findings/dcp_stream_extensions_order.py   # one, commuting: loaded; [add, xor]: fails

Found by ``pytest --pyargs ddp_verify.conformance`` (test_checkpoint.py).
"""

import io
import tempfile

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint._extension import ExtensionRegistry, StreamTransformExtension


def byte_map(name, forth, back):
    class Writer(io.RawIOBase):
        def __init__(self, output):
            self.output = output

        def writable(self):
            return True

        def write(self, b):
            data = bytes(memoryview(b))
            self.output.write(bytes(forth(x) for x in data))
            return len(data)

        def flush(self):
            self.output.flush()

        def close(self):
            if not self.closed:
                self.flush()
                self.output.close()
            super().close()

    class Reader(io.RawIOBase):
        def __init__(self, source):
            self.source = source

        def readable(self):
            return True

        def readinto(self, b):
            data = self.source.read(len(b))
            b[: len(data)] = bytes(back(x) for x in data)
            return len(data)

    class Extension(StreamTransformExtension):
        @staticmethod
        def registry_name():
            return name

        @staticmethod
        def from_descriptor(version):
            return Extension()

        def get_descriptor(self):
            return f"{name}/1"

        def transform_to(self, output):
            return Writer(output)

        def transform_from(self, input):
            return io.BufferedReader(Reader(input))

    return Extension


Add = byte_map("add", lambda x: (x + 3) % 256, lambda x: (x - 3) % 256)
Xor = byte_map("xor", lambda x: x ^ 0x5A, lambda x: x ^ 0x5A)
Xor2 = byte_map("xor2", lambda x: x ^ 0x33, lambda x: x ^ 0x33)

if __name__ == "__main__":
    registry = ExtensionRegistry()
    for kind in (Add, Xor, Xor2):
        registry.register(kind)
    saved = {"w": torch.arange(6, dtype=torch.float64)}
    for kinds in ([Add], [Xor, Xor2], [Add, Xor]):
        names = [k.registry_name() for k in kinds]
        with tempfile.TemporaryDirectory() as directory:
            writer = FileSystemWriter(directory, _extensions=[k() for k in kinds])
            dcp.save(saved, storage_writer=writer, no_dist=True)
            loaded = {"w": torch.zeros(6, dtype=torch.float64)}
            try:
                reader = FileSystemReader(directory, _extension_registry=registry)
                dcp.load(loaded, storage_reader=reader, no_dist=True)
                print(f"{names}: loaded {loaded['w'].tolist()}")
            except BaseException as exc:  # torch's CheckpointException is a BaseException
                print(f"{names}: {type(exc).__name__}: {str(exc).splitlines()[-1][:90]}")
