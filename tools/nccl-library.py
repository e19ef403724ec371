"""Prints the libnccl.so.2 of this interpreter's nvidia-nccl wheel (the one
torch brings), or an empty line when there is none."""

import glob
import sys

found = [p for d in sys.path for g in ("nvidia/nccl/lib", "nvidia/cu*/lib")
         for p in glob.glob(d + "/" + g + "/libnccl.so.2")]
print(found[0] if found else "")
