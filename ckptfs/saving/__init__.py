"""Saving checkpoints: any checkpoint ckptfs reads, as the zip archive ``torch.save`` writes (``save_torch``)."""

from ckptfs.saving.torch_save import save_torch

__all__ = ["save_torch"]
