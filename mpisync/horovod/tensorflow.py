"""``import mpisync.horovod.tensorflow``: Horovod's TensorFlow API is not provided."""

raise ImportError(
    "mpisync.horovod provides Horovod's PyTorch API only (import mpisync.horovod as hvd); "
    "TensorFlow and Keras are not supported"
)
