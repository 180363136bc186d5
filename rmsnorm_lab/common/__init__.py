"""Leaves every layer of the library may import: tensors seen as rows (``rows``), facts about the
device (``device``) and the NVTX ranges (``nvtx``). They import nothing of the lab but
``settings`` and ``registry``."""
