/* mpisync.tools.bench._osuloop: OSU's timed loop, in C.
 *
 * osu_bcast, osu_allreduce, osu_reduce and osu_allgather time each call with
 * MPI_Wtime around it, sum the times after the warm-up, and put a barrier
 * between iterations. Timed from Python, each call would also carry mpi4py's
 * argument handling (about a microsecond: more than a small Bcast itself), so
 * the loop runs here. The communicator arrives as mpi4py's handle (an integer
 * of MPI_Comm's width) and the buffers through the buffer protocol; every
 * count is checked against the buffers' lengths before the first call.
 * Optional: mpisync.tools.bench.osu times the same loop in Python, minus the
 * cost of the same call on an empty message, where this module is not built.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <mpi.h>
#include <stdint.h>

enum { OP_BCAST = 0, OP_ALLREDUCE = 1, OP_REDUCE = 2, OP_ALLGATHER = 3 };

static int one_call(int op, MPI_Comm comm, void *send, void *recv, int count, int root)
{
    switch (op) {
    case OP_BCAST:
        return MPI_Bcast(send, count, MPI_CHAR, root, comm);
    case OP_ALLREDUCE:
        return MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, comm);
    case OP_REDUCE:
        return MPI_Reduce(send, recv, count, MPI_FLOAT, MPI_SUM, root, comm);
    default:
        return MPI_Allgather(send, count, MPI_CHAR, recv, count, MPI_CHAR, comm);
    }
}

/* The bytes each buffer must hold for `count` elements of `op` at `size` ranks. */
static void needs(int op, Py_ssize_t count, int size, Py_ssize_t *send, Py_ssize_t *recv)
{
    *send = op == OP_ALLREDUCE || op == OP_REDUCE ? count * 4 : count;
    *recv = op == OP_BCAST ? 0 : op == OP_ALLGATHER ? count * size : *send;
}

static PyObject *osu_loop(PyObject *self, PyObject *args)
{
    int op, root, iterations, skip, size, rc = MPI_SUCCESS;
    unsigned long long handle;
    Py_ssize_t count, need_send, need_recv;
    Py_buffer send, recv;
    double total = 0.0;
    (void)self;
    if (!PyArg_ParseTuple(args, "iKw*w*niii", &op, &handle, &send, &recv, &count, &root,
                          &iterations, &skip))
        return NULL;
    MPI_Comm comm = (MPI_Comm)(uintptr_t)handle;
    if (op < OP_BCAST || op > OP_ALLGATHER || count < 0 || count > INT32_MAX || iterations < 0
        || skip < 0 || MPI_Comm_size(comm, &size) != MPI_SUCCESS) {
        PyErr_SetString(PyExc_ValueError, "osu_loop: bad operation, count or communicator");
        goto fail;
    }
    needs(op, count, size, &need_send, &need_recv);
    if (send.len < need_send || recv.len < need_recv) {
        PyErr_SetString(PyExc_ValueError, "osu_loop: a buffer is shorter than the count needs");
        goto fail;
    }
    Py_BEGIN_ALLOW_THREADS
    for (int i = 0; i < iterations + skip && rc == MPI_SUCCESS; i++) {
        double start = MPI_Wtime();
        rc = one_call(op, comm, send.buf, recv.buf, (int)count, root);
        double stop = MPI_Wtime();
        if (i >= skip)
            total += stop - start;
        if (rc == MPI_SUCCESS)
            rc = MPI_Barrier(comm);
    }
    Py_END_ALLOW_THREADS
    if (rc != MPI_SUCCESS) {
        PyErr_Format(PyExc_RuntimeError, "osu_loop: MPI error %d", rc);
        goto fail;
    }
    PyBuffer_Release(&send);
    PyBuffer_Release(&recv);
    return PyFloat_FromDouble(total);
fail:
    PyBuffer_Release(&send);
    PyBuffer_Release(&recv);
    return NULL;
}

static PyMethodDef methods[] = {
    {"osu_loop", osu_loop, METH_VARARGS,
     "osu_loop(op, comm_handle, send, recv, count, root, iterations, skip) -> seconds\n\n"
     "Run skip + iterations calls of the operation (0 Bcast of MPI_CHAR, 1 Allreduce and\n"
     "2 Reduce of MPI_FLOAT with MPI_SUM, 3 Allgather of MPI_CHAR), each timed with\n"
     "MPI_Wtime and followed by MPI_Barrier; return the summed time of the last iterations."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_osuloop", NULL, -1, methods};

PyMODINIT_FUNC PyInit__osuloop(void) { return PyModule_Create(&module); }
