"""Everything is in pyproject.toml but one file: ``ddp_verify_record.pth``, which goes to the
top of site-packages so that ``DDP_VERIFY_RECORD=DIR torchrun ... train.py`` records a script
that never imports ddp_verify (see ddp_verify/parity/autorecord.py). setuptools has no
declarative way to place a file there; this is the build step that does, for wheels and for
editable installs alike.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "ddp_verify_record.pth"


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        # An editable install's wheel is not build_lib: install_lib is its unpacked top.
        if self.editable_mode:
            top = self.get_finalized_command("install").install_lib
        else:
            top = self.build_lib
        self.copy_file(PTH, os.path.join(top, PTH), preserve_mode=False)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


setup(cmdclass={"build_py": BuildPyWithPth})
