/* lumenrt.native._core.Item: one descriptor popped from a ring.
 *
 * Invariants
 *   1. An Item owns a copy of the 56-byte lrt_desc, taken when it was popped: it points into no
 *      shared memory, so it stays valid after the ring, its Region or the producer is gone.
 *   2. Immutable: fields are read-only properties, converted to int on access (a pop allocates
 *      only the Item itself).
 *   3. Two Items are equal iff their descriptors are equal byte for byte: the fields sum to 56
 *      bytes and lrt/common.h asserts sizeof(lrt_desc) == 56, so there is no padding to compare.
 */
#include "internal.h"

typedef struct {
    PyObject_HEAD
    lrt_desc d;
} ItemObject;

PyObject *lrtpy_item_new(const lrt_desc *d) {
    ItemObject *it = PyObject_New(ItemObject, &lrtpy_item_type);
    if (it) it->d = *d;
    return (PyObject *)it;
}

#define ITEM_GET(name, expr)                                                                   \
    static PyObject *item_get_##name(ItemObject *self, void *c) { return PyLong_FromUnsignedLongLong(expr); }
ITEM_GET(request_id, self->d.request_id)
ITEM_GET(slot, self->d.slot)
ITEM_GET(nbytes, self->d.nbytes)
ITEM_GET(t_ns, self->d.t_ns)
ITEM_GET(aux0, self->d.aux[0])
ITEM_GET(aux1, self->d.aux[1])
ITEM_GET(aux2, self->d.aux[2])
ITEM_GET(kind, self->d.kind)
ITEM_GET(flags, self->d.flags)

static PyGetSetDef item_getset[] = {
    {"request_id", (getter)item_get_request_id, NULL, "caller's request id", NULL},
    {"slot", (getter)item_get_slot, NULL, "arena slot index", NULL},
    {"nbytes", (getter)item_get_nbytes, NULL, "payload size in bytes", NULL},
    {"t_ns", (getter)item_get_t_ns, NULL, "timestamp (CLOCK_MONOTONIC ns) set by the producer", NULL},
    {"aux0", (getter)item_get_aux0, NULL, "free word", NULL},
    {"aux1", (getter)item_get_aux1, NULL, "free word", NULL},
    {"aux2", (getter)item_get_aux2, NULL, "free word", NULL},
    {"kind", (getter)item_get_kind, NULL, "message kind", NULL},
    {"flags", (getter)item_get_flags, NULL, "flags (bit 31 reserved)", NULL},
    {NULL}};

static PyObject *item_repr(ItemObject *self) {
    return PyUnicode_FromFormat("Item(request_id=%llu, slot=%u, nbytes=%u, t_ns=%llu, aux0=%llu, kind=%u)",
                                (unsigned long long)self->d.request_id, self->d.slot, self->d.nbytes,
                                (unsigned long long)self->d.t_ns, (unsigned long long)self->d.aux[0],
                                self->d.kind);
}

static PyObject *item_richcompare(PyObject *a, PyObject *b, int op) {
    if (!PyObject_TypeCheck(b, &lrtpy_item_type) || (op != Py_EQ && op != Py_NE)) Py_RETURN_NOTIMPLEMENTED;
    int eq = memcmp(&((ItemObject *)a)->d, &((ItemObject *)b)->d, sizeof(lrt_desc)) == 0;
    if (op == Py_NE) eq = !eq;
    return PyBool_FromLong(eq);
}

PyTypeObject lrtpy_item_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "lumenrt.native._core.Item",
    .tp_basicsize = sizeof(ItemObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A descriptor popped from a ring (56 bytes; fields are converted on access).",
    .tp_getset = item_getset,
    .tp_repr = (reprfunc)item_repr,
    .tp_richcompare = item_richcompare,
};
