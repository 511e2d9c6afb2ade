/* mpisync._speedups: the per-tensor loops of a repeated sync, in C.
 *
 * Packing a bucket of small tensors is one short memcpy per tensor; in Python
 * (slice assignment) or through the kernel (pwritev) each costs 90-300 ns,
 * far more than the copy. These loops take the buffer objects the Python code
 * holds (the buffer protocol gives address, size and writability, and the
 * export keeps the memory in place), so no raw address crosses from Python,
 * and every copy is checked against the arena's bounds. Optional: mpisync
 * falls back to its Python and kernel paths when this module is not built
 * (mpisync/_runtime/speedups.py picks each loop; mpisync/_runtime/pyloops.py is
 * the Python form of every function here). Built against numpy's headers: arrays are read through
 * numpy's own accessors.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <stdint.h>
#include <string.h>

/* BufferList: the buffers of one copy list, held (exported) for as long as the list lives, so
 * their memory stays put; gather/scatter then copy from the saved addresses without visiting
 * the Python objects again (on a cache-cold sync of many small tensors those visits cost more
 * than the copies). */
typedef struct {
    PyObject_HEAD
    Py_ssize_t count;
    Py_ssize_t nbytes;
    int readonly;     /* some buffer is read-only: scatter refuses */
    Py_buffer *views; /* owned, or a run of the parent's */
    /* Each buffer's address and length again, 16 bytes apiece: the copy loops read these, not the
     * 80-byte Py_buffer structs, which on a cache-cold sync of thousands of tensors is 5x less
     * to fetch. */
    struct span { char *at; Py_ssize_t len; } *spans;
    PyObject *parent; /* a part (BufferList.part) keeps its parent, which holds the views */
    /* A list made by array_list() exports no buffers (views is NULL): it holds the arrays
     * themselves (owners, a tuple), each buffer's read-only flag (ro) and the shapes it read. */
    PyObject *owners;
    unsigned char *ro;
    PyObject *shape_bytes;
} BufferList;

static PyTypeObject BufferListType;

static void
BufferList_dealloc(BufferList *self)
{
    if (self->parent != NULL) {
        Py_DECREF(self->parent);
    } else {
        if (self->views != NULL) {
            for (Py_ssize_t i = 0; i < self->count; i++)
                PyBuffer_Release(&self->views[i]);
            PyMem_Free(self->views);
        }
        PyMem_Free(self->spans);
        PyMem_Free(self->ro);
        Py_XDECREF(self->owners);
        Py_XDECREF(self->shape_bytes);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
BufferList_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"buffers", "exact_type", NULL};
    PyObject *sequence, *items, *exact_type = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O:BufferList", keywords, &sequence, &exact_type))
        return NULL;
    if (exact_type != Py_None && !PyType_Check(exact_type)) {
        PyErr_SetString(PyExc_TypeError, "BufferList: exact_type must be a type or None");
        return NULL;
    }
    items = PySequence_Fast(sequence, "BufferList() takes a sequence of buffers");
    if (items == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    BufferList *self = (BufferList *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(items);
        return NULL;
    }
    self->views = PyMem_Calloc(n ? (size_t)n : 1, sizeof(Py_buffer));
    self->spans = PyMem_Calloc(n ? (size_t)n : 1, sizeof(struct span));
    if (self->views == NULL || self->spans == NULL) {
        Py_DECREF(items);
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    PyObject **objects = PySequence_Fast_ITEMS(items);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (exact_type != Py_None && (PyObject *)Py_TYPE(objects[i]) != exact_type) {
            PyErr_Format(PyExc_TypeError, "BufferList: item %zd is a %.200s, not exactly a %.200s", i,
                         Py_TYPE(objects[i])->tp_name, ((PyTypeObject *)exact_type)->tp_name);
            Py_DECREF(items);
            Py_DECREF(self);
            return NULL;
        }
        /* PyBUF_ND without strides: C-contiguous memory, with its shape. */
        if (PyObject_GetBuffer(objects[i], &self->views[i], PyBUF_ND) < 0) {
            Py_DECREF(items);
            Py_DECREF(self); /* releases the views acquired so far */
            return NULL;
        }
        self->count = i + 1;
        self->spans[i].at = self->views[i].buf;
        self->spans[i].len = self->views[i].len;
        self->nbytes += self->views[i].len;
        self->readonly |= self->views[i].readonly;
    }
    Py_DECREF(items);
    return (PyObject *)self;
}

/* Copy every buffer end to end into (gather) or out of (scatter) ``arena`` from ``offset``. */
static PyObject *
copy_all(BufferList *self, PyObject *args, int gather)
{
    Py_buffer arena;
    Py_ssize_t offset = 0;
    if (!PyArg_ParseTuple(args, gather ? "w*|n" : "y*|n", &arena, &offset))
        return NULL;
    if (!gather && self->readonly) {
        PyBuffer_Release(&arena);
        PyErr_SetString(PyExc_ValueError, "BufferList.scatter: a buffer of the list is read-only");
        return NULL;
    }
    if (offset < 0 || self->nbytes > arena.len - offset) {
        PyErr_Format(PyExc_ValueError, "BufferList: %zd bytes do not fit at offset %zd of %zd",
                     self->nbytes, offset, arena.len);
        PyBuffer_Release(&arena);
        return NULL;
    }
    char *at = (char *)arena.buf + offset;
    const struct span *spans = self->spans;
    for (Py_ssize_t i = 0; i < self->count; i++) {
        if (gather)
            memcpy(at, spans[i].at, (size_t)spans[i].len);
        else
            memcpy(spans[i].at, at, (size_t)spans[i].len);
        at += spans[i].len;
    }
    PyBuffer_Release(&arena);
    return PyLong_FromSsize_t(self->nbytes);
}

static PyObject *
BufferList_gather(BufferList *self, PyObject *args)
{
    return copy_all(self, args, 1);
}

static PyObject *
BufferList_scatter(BufferList *self, PyObject *args)
{
    return copy_all(self, args, 0);
}

static Py_ssize_t
BufferList_len(BufferList *self)
{
    return self->count;
}

static PyObject *
BufferList_get_nbytes(BufferList *self, void *closure)
{
    return PyLong_FromSsize_t(self->nbytes);
}

static PyObject *
BufferList_get_readonly(BufferList *self, void *closure)
{
    return PyBool_FromLong(self->readonly);
}

/* One native int64 per buffer (numpy.frombuffer(..., numpy.int64)): its start address if
   addresses, else its byte length. */
static PyObject *
BufferList_span_words(BufferList *self, int addresses)
{
    PyObject *out = PyBytes_FromStringAndSize(NULL, self->count * (Py_ssize_t)sizeof(int64_t));
    if (out == NULL)
        return NULL;
    int64_t *word = (int64_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < self->count; i++)
        word[i] = addresses ? (int64_t)(intptr_t)self->spans[i].at : (int64_t)self->spans[i].len;
    return out;
}

/* The byte length of every buffer, as native int64. */
static PyObject *
BufferList_lengths(BufferList *self, PyObject *unused)
{
    return BufferList_span_words(self, 0);
}

/* Every buffer's shape as native int64 words: its number of dimensions, then each extent. */
static PyObject *
BufferList_shapes(BufferList *self, PyObject *unused)
{
    if (self->shape_bytes != NULL) {
        Py_INCREF(self->shape_bytes);
        return self->shape_bytes;
    }
    if (self->views == NULL) {
        PyErr_SetString(PyExc_ValueError, "BufferList.shapes: a part of an array_list() keeps no shapes");
        return NULL;
    }
    Py_ssize_t words = self->count;
    for (Py_ssize_t i = 0; i < self->count; i++)
        words += self->views[i].ndim;
    PyObject *out = PyBytes_FromStringAndSize(NULL, words * (Py_ssize_t)sizeof(int64_t));
    if (out == NULL)
        return NULL;
    int64_t *word = (int64_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < self->count; i++) {
        const Py_buffer *view = &self->views[i];
        *word++ = view->ndim;
        for (int d = 0; d < view->ndim; d++)
            *word++ = (int64_t)view->shape[d];
    }
    return out;
}

/* Buffers first..last-1 as a BufferList of their own, sharing this one's (which it keeps alive). */
static PyObject *
BufferList_part(BufferList *self, PyObject *args)
{
    Py_ssize_t first, last;
    if (!PyArg_ParseTuple(args, "nn", &first, &last))
        return NULL;
    if (first < 0 || last < first || last > self->count) {
        PyErr_Format(PyExc_IndexError, "BufferList.part(%zd, %zd) of %zd buffers", first, last, self->count);
        return NULL;
    }
    BufferList *part = (BufferList *)BufferListType.tp_alloc(&BufferListType, 0);
    if (part == NULL)
        return NULL;
    part->parent = self->parent != NULL ? self->parent : (PyObject *)self;
    Py_INCREF(part->parent);
    part->views = self->views != NULL ? self->views + first : NULL;
    part->ro = self->ro != NULL ? self->ro + first : NULL;
    part->spans = self->spans + first;
    part->count = last - first;
    for (Py_ssize_t i = 0; i < part->count; i++) {
        part->nbytes += part->spans[i].len;
        part->readonly |= part->views != NULL ? part->views[i].readonly : part->ro[i];
    }
    return (PyObject *)part;
}

/* Every buffer's start address as native int64. */
static PyObject *
BufferList_addresses(BufferList *self, PyObject *unused)
{
    return BufferList_span_words(self, 1);
}

static PyMethodDef BufferList_methods[] = {
    {"gather", (PyCFunction)BufferList_gather, METH_VARARGS,
     "gather(arena, offset=0) -> bytes: copy every buffer, end to end, into the writable arena from "
     "offset."},
    {"scatter", (PyCFunction)BufferList_scatter, METH_VARARGS,
     "scatter(arena, offset=0) -> bytes: fill every buffer, end to end, from the arena at offset."},
    {"lengths", (PyCFunction)BufferList_lengths, METH_NOARGS,
     "lengths() -> bytes: every buffer's length as native int64."},
    {"shapes", (PyCFunction)BufferList_shapes, METH_NOARGS,
     "shapes() -> bytes: per buffer, its ndim then its extents, as native int64 words."},
    {"part", (PyCFunction)BufferList_part, METH_VARARGS,
     "part(first, last) -> BufferList: buffers first..last-1, sharing this list's hold on them."},
    {"addresses", (PyCFunction)BufferList_addresses, METH_NOARGS,
     "addresses() -> bytes: every buffer's start address as native int64."},
    {NULL, NULL, 0, NULL},
};

static PyObject *
BufferList_get_compiled(BufferList *self, void *closure)
{
    Py_RETURN_TRUE;
}

static PyGetSetDef BufferList_getset[] = {
    {"compiled", (getter)BufferList_get_compiled, NULL, "True: the C loops copy this list.", NULL},
    {"nbytes", (getter)BufferList_get_nbytes, NULL, "Bytes of all the buffers together.", NULL},
    {"readonly", (getter)BufferList_get_readonly, NULL, "Whether some buffer is read-only.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods BufferList_as_sequence = {.sq_length = (lenfunc)BufferList_len};

static PyTypeObject BufferListType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mpisync._speedups.BufferList",
    .tp_basicsize = sizeof(BufferList),
    .tp_dealloc = (destructor)BufferList_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "BufferList(buffers, exact_type=None): C-contiguous buffers held for fast gather/scatter "
              "against one arena; with exact_type, every item must be exactly of that type.",
    .tp_methods = BufferList_methods,
    .tp_getset = BufferList_getset,
    .tp_as_sequence = &BufferList_as_sequence,
    .tp_new = BufferList_new,
};

/* Whether dict ``mapping`` holds exactly ``keys`` -> ``values`` (tuples), in that order, by
 * identity. Reads the dict's entries only: no reference counts touched, no objects visited. */
static PyObject *
same_items(PyObject *module, PyObject *args)
{
    PyObject *mapping, *keys, *values;
    if (!PyArg_ParseTuple(args, "O!O!O!", &PyDict_Type, &mapping, &PyTuple_Type, &keys, &PyTuple_Type, &values))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(keys);
    if (PyTuple_GET_SIZE(values) != n || PyDict_GET_SIZE(mapping) != n)
        Py_RETURN_FALSE;
    Py_ssize_t position = 0, i = 0;
    PyObject *key, *value;
    while (PyDict_Next(mapping, &position, &key, &value)) {
        if (i >= n || key != PyTuple_GET_ITEM(keys, i) || value != PyTuple_GET_ITEM(values, i))
            Py_RETURN_FALSE;
        i++;
    }
    return PyBool_FromLong(i == n);
}

/* The dict's version tag (PEP 509): it changes with every change to the dict and is never shared
 * by two dicts (one global counter), so an equal tag means the same dict with the same entries.
 * -1 from Python 3.12 on, where the tag is deprecated, and on PyPy: callers then compare the entries
 * (with the caches cold, that walk is most of what a repeated sync of 5000 tensors adds:
 * docs/performance.md, "The C loops, with and without"). */
static PyObject *
dict_version(PyObject *module, PyObject *mapping)
{
    if (!PyDict_Check(mapping)) {
        PyErr_SetString(PyExc_TypeError, "dict_version() takes a dict");
        return NULL;
    }
#if PY_VERSION_HEX < 0x030C0000 && !defined(PYPY_VERSION)
    return PyLong_FromUnsignedLongLong(((PyDictObject *)mapping)->ma_version_tag);
#else
    return PyLong_FromLong(-1);
#endif
}

/* array_states / same_states: what a prepared sync relies on about each numpy array (data address,
 * dtype object, writability, ndim, shape, strides), read through numpy's accessors, far cheaper
 * than a buffer export. Items that are not exactly of ``array_type`` (torch tensors, ...) get one
 * zero word and are checked by the caller. */
/* The array_type argument must be numpy.ndarray: the loops read its items as numpy arrays. */
static int
check_array_type(PyObject *type)
{
    if (type == (PyObject *)&PyArray_Type)
        return 0;
    PyErr_SetString(PyExc_TypeError, "array_type must be numpy.ndarray");
    return -1;
}

static Py_ssize_t
state_words(PyObject *item, PyTypeObject *type, int64_t *out)
{
    if (Py_TYPE(item) != type) {
        if (out)
            out[0] = 0;
        return 1;
    }
    PyArrayObject *a = (PyArrayObject *)item;
    Py_ssize_t nd = PyArray_NDIM(a);
    if (out) {
        const npy_intp *dims = PyArray_DIMS(a), *strides = PyArray_STRIDES(a);
        out[0] = 1 + nd;
        out[1] = (int64_t)(intptr_t)PyArray_DATA(a);
        out[2] = (int64_t)(intptr_t)PyArray_DESCR(a);
        out[3] = PyArray_ISWRITEABLE(a) ? 1 : 0;
        for (Py_ssize_t k = 0; k < nd; k++) {
            out[4 + 2 * k] = dims[k];
            out[5 + 2 * k] = strides[k];
        }
    }
    return 4 + 2 * nd;
}

static PyObject *
array_states(PyObject *module, PyObject *args)
{
    PyObject *items, *type;
    if (!PyArg_ParseTuple(args, "OO!", &items, &PyType_Type, &type) || check_array_type(type) < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(items, "array_states() takes a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), words = 0;
    PyObject **objs = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++)
        words += state_words(objs[i], (PyTypeObject *)type, NULL);
    PyObject *out = PyBytes_FromStringAndSize(NULL, words * 8);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    int64_t *w = (int64_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++)
        w += state_words(objs[i], (PyTypeObject *)type, w);
    Py_DECREF(seq);
    return out;
}

static PyObject *
same_states(PyObject *module, PyObject *args)
{
    PyObject *items, *type;
    Py_buffer states;
    if (!PyArg_ParseTuple(args, "OO!y*", &items, &PyType_Type, &type, &states))
        return NULL;
    if (check_array_type(type) < 0) {
        PyBuffer_Release(&states);
        return NULL;
    }
    PyObject *seq = PySequence_Fast(items, "same_states() takes a sequence");
    if (seq == NULL) {
        PyBuffer_Release(&states);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), left = states.len / 8;
    PyObject **objs = PySequence_Fast_ITEMS(seq);
    const int64_t *w = (const int64_t *)states.buf;
    int same = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = objs[i];
        if (left < 1) {
            same = 0;
            break;
        }
        if (Py_TYPE(item) != (PyTypeObject *)type) {
            if (w[0] != 0) {
                same = 0;
                break;
            }
            w++;
            left--;
            continue;
        }
        PyArrayObject *a = (PyArrayObject *)item;
        Py_ssize_t nd = PyArray_NDIM(a);
        const npy_intp *dims = PyArray_DIMS(a), *strides = PyArray_STRIDES(a);
        if (w[0] != 1 + nd || left < 4 + 2 * nd || w[1] != (int64_t)(intptr_t)PyArray_DATA(a)
            || w[2] != (int64_t)(intptr_t)PyArray_DESCR(a) || w[3] != (PyArray_ISWRITEABLE(a) ? 1 : 0)) {
            same = 0;
            break;
        }
        for (Py_ssize_t k = 0; k < nd; k++) {
            if (w[4 + 2 * k] != dims[k] || w[5 + 2 * k] != strides[k]) {
                same = 0;
                break;
            }
        }
        if (!same)
            break;
        w += 4 + 2 * nd;
        left -= 4 + 2 * nd;
    }
    if (left != 0)
        same = 0;
    Py_DECREF(seq);
    PyBuffer_Release(&states);
    return PyBool_FromLong(same);
}

/* array_list: the BufferList, dtype runs and states of a sequence of exact ``array_type`` arrays in
 * one pass over numpy's struct fields, exporting no buffer (taking and releasing an export per array
 * was most of a cold scan of thousands of small arrays: docs/performance.md). It holds the arrays
 * instead, so their memory cannot be freed, and a resize needs refcheck=False; a later sync
 * re-checks every address (see mpisync/params/recheck.py) before it copies. Each array must be C-contiguous, as a PyBUF_ND export
 * requires; its byte length is its dtype's itemsize times its extents. */
/* On a cold sync each array's header and extents are cache misses: ask for them a few arrays ahead. */
#define PREFETCH_AHEAD 16
#if defined(__GNUC__)
#define PREFETCH(p) __builtin_prefetch(p)
#else
#define PREFETCH(p) ((void)0)
#endif

static int
array_entry(BufferList *list, Py_ssize_t i, PyObject *item, int64_t **shape, int64_t **state)
{
    PyArrayObject *a = (PyArrayObject *)item;
    if (!PyArray_IS_C_CONTIGUOUS(a)) {
        PyErr_Format(PyExc_BufferError, "array_list: item %zd is not C-contiguous", i);
        return -1;
    }
    Py_ssize_t nd = PyArray_NDIM(a), len = PyArray_ITEMSIZE(a);
    const npy_intp *dims = PyArray_DIMS(a);
    *(*shape)++ = nd;
    for (Py_ssize_t k = 0; k < nd; k++) {
        len *= dims[k];
        *(*shape)++ = dims[k];
    }
    *state += state_words(item, Py_TYPE(item), *state);
    list->spans[i].at = PyArray_DATA(a);
    list->spans[i].len = len;
    list->ro[i] = PyArray_ISWRITEABLE(a) ? 0 : 1;
    list->nbytes += len;
    list->readonly |= list->ro[i];
    return 0;
}

/* The [[dtype, count], ...] runs of the list's consecutive equal dtype objects. */
static PyObject *
descr_runs(PyObject *const *objs, Py_ssize_t n)
{
    PyObject *runs = PyList_New(0);
    for (Py_ssize_t i = 0; runs != NULL && i < n;) {
        PyArray_Descr *descr = PyArray_DESCR((PyArrayObject *)objs[i]);
        Py_ssize_t j = i + 1;
        while (j < n && PyArray_DESCR((PyArrayObject *)objs[j]) == descr)
            j++;
        PyObject *run = Py_BuildValue("[On]", (PyObject *)descr, j - i);
        if (run == NULL || PyList_Append(runs, run) < 0) {
            Py_XDECREF(run);
            Py_CLEAR(runs);
            break;
        }
        Py_DECREF(run);
        i = j;
    }
    return runs;
}

static PyObject *
array_list(PyObject *module, PyObject *args)
{
    PyObject *items, *type;
    if (!PyArg_ParseTuple(args, "OO!", &items, &PyType_Type, &type) || check_array_type(type) < 0)
        return NULL;
    PyObject *owners = PySequence_Tuple(items); /* its own tuple: the caller's list may change */
    if (owners == NULL)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(owners), shape_words = n, state_total = 0;
    PyObject *const *objs = &PyTuple_GET_ITEM(owners, 0);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + PREFETCH_AHEAD < n)
            PREFETCH(objs[i + PREFETCH_AHEAD]);
        if (Py_TYPE(objs[i]) != (PyTypeObject *)type) {
            PyErr_Format(PyExc_TypeError, "array_list: item %zd is a %.200s, not exactly a %.200s", i,
                         Py_TYPE(objs[i])->tp_name, ((PyTypeObject *)type)->tp_name);
            Py_DECREF(owners);
            return NULL;
        }
        shape_words += PyArray_NDIM((PyArrayObject *)objs[i]);
        state_total += state_words(objs[i], (PyTypeObject *)type, NULL);
    }
    BufferList *list = (BufferList *)BufferListType.tp_alloc(&BufferListType, 0);
    if (list == NULL) {
        Py_DECREF(owners);
        return NULL;
    }
    list->owners = owners;
    list->spans = PyMem_Calloc(n ? (size_t)n : 1, sizeof(struct span));
    list->ro = PyMem_Calloc(n ? (size_t)n : 1, 1);
    list->shape_bytes = PyBytes_FromStringAndSize(NULL, shape_words * 8);
    PyObject *states = PyBytes_FromStringAndSize(NULL, state_total * 8);
    PyObject *runs = NULL;
    if (list->spans == NULL || list->ro == NULL || list->shape_bytes == NULL || states == NULL) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        goto fail;
    }
    list->count = n;
    int64_t *shape = (int64_t *)PyBytes_AS_STRING(list->shape_bytes);
    int64_t *state = (int64_t *)PyBytes_AS_STRING(states);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + PREFETCH_AHEAD < n) /* its header was read above: fetch the extents and strides */
            PREFETCH(PyArray_DIMS((PyArrayObject *)objs[i + PREFETCH_AHEAD]));
        if (array_entry(list, i, objs[i], &shape, &state) < 0)
            goto fail;
    }
    runs = descr_runs(objs, n);
    if (runs == NULL)
        goto fail;
    return Py_BuildValue("(NNN)", (PyObject *)list, runs, states);
fail:
    Py_XDECREF(states);
    Py_DECREF(list);
    return NULL;
}

/* sorted_names(dict) -> (names, in_order): the dict's keys as sorted() gives them, and whether the
 * dict already held them in that order (then no sort runs: checking the order costs what sorted()
 * spends finding its one run, without the copy). None when a key is not exactly a str. */
static PyObject *
sorted_names(PyObject *module, PyObject *mapping)
{
    if (!PyDict_Check(mapping)) {
        PyErr_SetString(PyExc_TypeError, "sorted_names() takes a dict");
        return NULL;
    }
    /* A dict's own order is its iteration order; an OrderedDict iterates in its own (move_to_end
     * changes it, not the dict's), which is the order its values() give. */
    PyObject *names = PyDict_CheckExact(mapping) ? PyDict_Keys(mapping) : PySequence_List(mapping);
    if (names == NULL)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(names);
    int in_order = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyUnicode_CheckExact(PyList_GET_ITEM(names, i))) {
            Py_DECREF(names);
            Py_RETURN_NONE;
        }
        if (in_order && i > 0) {
            int before = PyObject_RichCompareBool(PyList_GET_ITEM(names, i - 1), PyList_GET_ITEM(names, i), Py_LT);
            if (before < 0) {
                Py_DECREF(names);
                return NULL;
            }
            in_order = before;
        }
    }
    if (!in_order && PyList_Sort(names) < 0) {
        Py_DECREF(names);
        return NULL;
    }
    return Py_BuildValue("(NO)", names, in_order ? Py_True : Py_False);
}

/* joined_names(names) -> bytes or None: the UTF-8 of "\0".join(names) when every item is a str
 * that holds no NUL and encodes to UTF-8 (no lone surrogate), else None (the caller's Python path
 * encodes those). One allocation and a copy per name, where the Python join, NUL count and
 * encoding each pass over every character. */
static PyObject *
joined_names(PyObject *module, PyObject *items)
{
    PyObject *seq = PySequence_Fast(items, "joined_names() takes a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), total = n > 0 ? n - 1 : 0;
    PyObject **objs = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t len;
        if (!PyUnicode_Check(objs[i]) || PyUnicode_AsUTF8AndSize(objs[i], &len) == NULL) {
            PyErr_Clear();
            Py_DECREF(seq);
            Py_RETURN_NONE;
        }
        total += len;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    char *at = PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t len;
        const char *utf8 = PyUnicode_AsUTF8AndSize(objs[i], &len); /* cached by the pass above */
        if (memchr(utf8, 0, (size_t)len) != NULL) {
            Py_DECREF(out);
            Py_DECREF(seq);
            Py_RETURN_NONE;
        }
        if (i > 0)
            *at++ = 0;
        memcpy(at, utf8, (size_t)len);
        at += len;
    }
    Py_DECREF(seq);
    return out;
}


static PyMethodDef methods[] = {
    {"sorted_names", sorted_names, METH_O,
     "sorted_names(dict) -> (names, in_order) or None: sorted(dict) and whether the dict held its keys in "
     "that order; None when a key is not exactly a str."},
    {"joined_names", joined_names, METH_O,
     "joined_names(names) -> bytes or None: '\\0'.join(names) in UTF-8; None when a name is not a str, "
     "holds a NUL or does not encode (a lone surrogate)."},
    {"array_list", array_list, METH_VARARGS,
     "array_list(items, array_type) -> (BufferList, dtype runs, states): for exact, C-contiguous "
     "array_type items, their BufferList (holding the arrays, exporting no buffer), the [[dtype, count], "
     "...] runs of consecutive equal dtype objects, and array_states(items, array_type), in one pass."},
    {"array_states", array_states, METH_VARARGS,
     "array_states(items, array_type) -> bytes: each exact array_type item's address, dtype, writability, "
     "shape and strides (one zero word for other items)."},
    {"same_states", same_states, METH_VARARGS,
     "same_states(items, array_type, states) -> bool: array_states(items, array_type) == states, without "
     "building it."},
    {"dict_version", dict_version, METH_O,
     "dict_version(dict) -> int: changes with every change to the dict, never equal for two dicts; "
     "-1 where the interpreter has no version tag (3.12 on)."},
    {"same_items", same_items, METH_VARARGS,
     "same_items(dict, keys, values) -> bool: the dict holds exactly these objects, in order."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "mpisync._speedups",
                                    "The per-tensor loops of a repeated sync, in C.", -1, methods};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    import_array();
    if (PyType_Ready(&BufferListType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&BufferListType);
    if (PyModule_AddObject(m, "BufferList", (PyObject *)&BufferListType) < 0) {
        Py_DECREF(&BufferListType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
