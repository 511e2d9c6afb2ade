"""What Horovod (or mpisync, via python -m mpisync.horovod) does with Adasum cases it may refuse."""

import horovod.torch as hvd
import torch

hvd.init()


def attempt(label, fn):
    try:
        out = fn()
        print(hvd.rank(), label, "OK", out.tolist() if hasattr(out, "tolist") else out, flush=True)
    except Exception as e:  # noqa: BLE001
        print(hvd.rank(), label, type(e).__name__, str(e)[:160].replace("\n", " "), flush=True)


attempt("float32", lambda: hvd.allreduce(torch.ones(2), op=hvd.Adasum, name="f"))
if hvd.size() & (hvd.size() - 1) == 0:
    attempt(
        "int32", lambda: hvd.allreduce(torch.ones(2, dtype=torch.int32), op=hvd.Adasum, name="i")
    )
    attempt(
        "bfloat16",
        lambda: hvd.allreduce(torch.ones(2, dtype=torch.bfloat16), op=hvd.Adasum, name="b"),
    )
    attempt(
        "reducescatter",
        lambda: hvd.reducescatter(torch.ones(hvd.size(), 2), op=hvd.Adasum, name="r"),
    )
    attempt("after", lambda: hvd.allreduce(torch.ones(2), op=hvd.Adasum, name="f2"))
hvd.shutdown()
