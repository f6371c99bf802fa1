"""Writing tensors' bytes into a ``torch.save`` zip in place (``ckptfs.open(path, mode="r+")``, ``mount -o rw``).

``targets`` says which tensors can be written and where their bytes are; ``zip_crc`` finds and sets a record's
CRC-32 in its local framing and the central directory; ``writer`` ties them together: positioned writes, the
ranges written per record, and each record's CRC once it is whole.
"""

from ckptfs.writing.targets import Target, refusal_of_archive
from ckptfs.writing.writer import TensorWriter

__all__ = ["Target", "TensorWriter", "refusal_of_archive"]
