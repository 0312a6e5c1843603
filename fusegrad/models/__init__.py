"""Pretrained models built from fusegrad.nn layers, with loaders for the weight files of their common PyTorch ports.

Vision: `EfficientNet` (B0-B7, Lite0-4) and `ResNet` (18/34/50/101/152); `imagenet_labels()` names their outputs.
"""
from fusegrad.models.efficientnet import EfficientNet
from fusegrad.models.imagenet import imagenet_labels, preprocess
from fusegrad.models.resnet import ResNet
from fusegrad.models.weights import WeightsNotFound, find_weights, load_weights, read_checkpoint

__all__ = ["EfficientNet", "ResNet", "WeightsNotFound", "find_weights", "imagenet_labels", "load_weights",
           "preprocess", "read_checkpoint"]
