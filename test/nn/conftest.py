"""Each nn test starts from the same RNG state and in eval mode, and can't leak training/no_grad flags into the next."""
import pytest

from fusegrad import Tensor
from fusegrad.helpers import TRAINING


@pytest.fixture(autouse=True)
def clean_state():
    Tensor.manual_seed(0)
    flags = (Tensor.training, Tensor.no_grad, TRAINING.value)
    yield
    Tensor.training, Tensor.no_grad, TRAINING.value = flags
