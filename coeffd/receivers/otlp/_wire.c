/*
 * OTLP ExportTraceServiceRequest wire bytes -> coeffd records, in one pass of C.
 *
 * Why: the pure-Python decoder pays two protobuf accessor calls (a Python wrapper
 * each) per attribute it reads, ~5x a parse-only upb pass over the same bytes
 * (bench/ingest.py). This walks the wire format directly and builds the same records
 * by calling their msgspec constructors, so the per-attribute cost is a key compare
 * and, for the value, one Python int/float/str.
 *
 * Semantics are the pure-Python decoder's (decode.py, attrs.py, kinds.py); the kinds
 * and their keys come from a plan built in Python (kinds.wire_plan), so this file holds
 * no attribute names. Anything this walker does not reproduce exactly (a singular
 * message field repeated, a known field with an unexpected wire type, groups, an
 * AnyValue arm it does not know, a string that is not UTF-8) makes decode() return None,
 * and the caller decodes that request with the pure-Python path. Callers validate the
 * bytes with upb first, so malformed protobuf is upb's DecodeError, as before.
 *
 * Safety: every read is bounds-checked against its enclosing message; nesting is fixed
 * (request > resource spans > scope spans > span > event > key/value > value), never
 * recursive, and nested array/kvlist values are skipped, not walked.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_FIELDS 32
#define MAX_ENTRIES 64 /* attributes of an event read in one pass; more take two */
#define MAX_NS_U ((uint64_t)INT64_MAX)
#define MAX_COUNT_U ((uint64_t)1 << 48)

enum { T_INT = 0, T_NS = 1, T_FLOAT = 2, T_STR = 3, T_SECONDS = 4 };
enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_I32 = 5 };
/* Return codes of the walkers: OK, a Python error is set, or hand over to Python. */
enum { D_OK = 0, D_ERR = -1, D_FALLBACK = -2 };
/* AnyValue arms (field numbers); 0: unset. */
enum { A_NONE = 0, A_STR = 1, A_INT = 3, A_DOUBLE = 4 };

/* ------------------------------------------------------------------- wire reading */

typedef struct {
    uint32_t num;
    int wt;
    uint64_t v;         /* varint / fixed value */
    const uint8_t *p;   /* LEN: payload */
    Py_ssize_t len;
} Field;

#define INLINE static inline __attribute__((always_inline))

INLINE int
read_varint(const uint8_t **pp, const uint8_t *end, uint64_t *out)
{
    const uint8_t *p = *pp;
    if (p < end && *p < 0x80) { /* tags, lengths and most values: one byte */
        *out = *p;
        *pp = p + 1;
        return 0;
    }
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (p >= end)
            return -1;
        uint8_t b = *p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *pp = p;
            *out = v;
            return 0;
        }
    }
    return -1;
}

static inline uint64_t
le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* 1: a field read into *f; 0: end of message; -1: malformed or a group. */
INLINE int
next_field(const uint8_t **pp, const uint8_t *end, Field *f)
{
    if (*pp >= end)
        return 0;
    uint64_t tag, len;
    if (read_varint(pp, end, &tag))
        return -1;
    f->num = (uint32_t)(tag >> 3);
    f->wt = (int)(tag & 7);
    if (f->num == 0 || (tag >> 3) > 0x1fffffff)
        return -1;
    switch (f->wt) {
    case WT_VARINT:
        return read_varint(pp, end, &f->v) ? -1 : 1;
    case WT_I64:
        if (end - *pp < 8)
            return -1;
        f->v = le64(*pp);
        *pp += 8;
        return 1;
    case WT_LEN:
        if (read_varint(pp, end, &len) || len > (uint64_t)(end - *pp))
            return -1;
        f->p = *pp;
        f->len = (Py_ssize_t)len;
        *pp += len;
        return 1;
    case WT_I32:
        if (end - *pp < 4)
            return -1;
        f->v = (uint64_t)(*pp)[0] | ((uint64_t)(*pp)[1] << 8) | ((uint64_t)(*pp)[2] << 16)
               | ((uint64_t)(*pp)[3] << 24);
        *pp += 4;
        return 1;
    default:
        return -1;
    }
}

/* ------------------------------------------------------------------------- plan */

typedef struct {
    const char *key;
    Py_ssize_t klen;
    int type;
    int required;
    PyObject *r_missing, *r_type, *r_nonfinite, *r_range; /* borrowed from the plan */
} FieldSpec;

typedef struct {
    PyObject *ctor;
    PyObject *kind; /* NULL: no kind argument */
    const char *name; /* event name, or span name (prefix when span_prefix) */
    Py_ssize_t nlen;
    int nfields;
    FieldSpec fields[MAX_FIELDS + 1]; /* + the journey's fallback key */
    int status;     /* span: append status.code == ERROR */
    int ratio_idx;  /* -1, or the field bounded to [0, 1] */
    int fallback;   /* fields[nfields] is read when field 0 is absent */
    int shed;       /* step summary: partial decode of steps keep() rejects */
    int step_idx;
    int npartial;
    int partial[MAX_FIELDS];
} KindSpec;

typedef struct {
    const char *name;
    Py_ssize_t nlen;
    PyObject *name_obj;
    int span_prefix;
    KindSpec span;
    int nevents;
    KindSpec *events;
} ScopeSpec;

typedef struct {
    PyObject *owner; /* the plan tuple: keeps every borrowed object alive */
    PyObject *span_info;
    PyObject *r_ids, *r_span_time, *r_wall, *r_parent;
    PyObject *zero;
    int nscopes;
    ScopeSpec *scopes;
} Plan;

static const char *PLAN_CAPSULE = "coeffd._wire.Plan";

static void
plan_free(Plan *plan)
{
    if (plan == NULL)
        return;
    if (plan->scopes) {
        for (int i = 0; i < plan->nscopes; i++)
            PyMem_Free(plan->scopes[i].events);
        PyMem_Free(plan->scopes);
    }
    Py_XDECREF(plan->owner);
    PyMem_Free(plan);
}

static void
plan_capsule_free(PyObject *capsule)
{
    plan_free((Plan *)PyCapsule_GetPointer(capsule, PLAN_CAPSULE));
}

static int
bytes_arg(PyObject *o, const char **s, Py_ssize_t *n)
{
    if (!PyBytes_Check(o)) {
        PyErr_SetString(PyExc_TypeError, "plan: expected bytes");
        return -1;
    }
    *s = PyBytes_AS_STRING(o);
    *n = PyBytes_GET_SIZE(o);
    return 0;
}

/* field: (key: bytes, type, required, missing, type, nonfinite, range reasons) */
static int
parse_field(PyObject *t, FieldSpec *f)
{
    PyObject *key;
    if (!PyArg_ParseTuple(t, "SiiUUUU", &key, &f->type, &f->required, &f->r_missing,
                          &f->r_type, &f->r_nonfinite, &f->r_range))
        return -1;
    if (f->type < T_INT || f->type > T_SECONDS) {
        PyErr_SetString(PyExc_ValueError, "plan: unknown field type");
        return -1;
    }
    return bytes_arg(key, &f->key, &f->klen);
}

/* kind: (name: bytes, ctor, kind | None, fields, status, ratio_idx, fallback field |
 *        None, shed, step_idx, partial indices) */
static int
parse_kind(PyObject *t, KindSpec *k)
{
    PyObject *name, *fields, *fallback, *partial;
    if (!PyArg_ParseTuple(t, "SOOO!iiOiiO!", &name, &k->ctor, &k->kind, &PyTuple_Type,
                          &fields, &k->status, &k->ratio_idx, &fallback, &k->shed,
                          &k->step_idx, &PyTuple_Type, &partial))
        return -1;
    if (k->kind == Py_None)
        k->kind = NULL;
    if (bytes_arg(name, &k->name, &k->nlen))
        return -1;
    Py_ssize_t n = PyTuple_GET_SIZE(fields), np = PyTuple_GET_SIZE(partial);
    if (n > MAX_FIELDS || np > MAX_FIELDS || k->ratio_idx >= n || k->step_idx >= n) {
        PyErr_SetString(PyExc_ValueError, "plan: too many fields or a bad index");
        return -1;
    }
    k->nfields = (int)n;
    for (Py_ssize_t i = 0; i < n; i++)
        if (parse_field(PyTuple_GET_ITEM(fields, i), &k->fields[i]))
            return -1;
    k->fallback = fallback != Py_None;
    if (k->fallback && parse_field(fallback, &k->fields[n]))
        return -1;
    k->npartial = (int)np;
    for (Py_ssize_t i = 0; i < np; i++) {
        long j = PyLong_AsLong(PyTuple_GET_ITEM(partial, i));
        if (j < 0 || j >= n) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "plan: bad partial index");
            return -1;
        }
        k->partial[i] = (int)j;
    }
    if (k->shed && k->step_idx < 0) {
        PyErr_SetString(PyExc_ValueError, "plan: shedding needs a step field");
        return -1;
    }
    return 0;
}

/* scope: (name: bytes, name: str, span prefix match, span kind, event kinds) */
static int
parse_scope(PyObject *t, ScopeSpec *s)
{
    PyObject *name, *span, *events;
    if (!PyArg_ParseTuple(t, "SUiOO!", &name, &s->name_obj, &s->span_prefix, &span,
                          &PyTuple_Type, &events))
        return -1;
    if (bytes_arg(name, &s->name, &s->nlen) || parse_kind(span, &s->span))
        return -1;
    s->nevents = (int)PyTuple_GET_SIZE(events);
    s->events = PyMem_Calloc(s->nevents ? s->nevents : 1, sizeof(KindSpec));
    if (s->events == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (int i = 0; i < s->nevents; i++)
        if (parse_kind(PyTuple_GET_ITEM(events, i), &s->events[i]))
            return -1;
    return 0;
}

/* compile_plan((SpanInfo, (ids, span_time, wall, parent_rejected reasons), scopes)) */
static PyObject *
compile_plan(PyObject *self, PyObject *arg)
{
    PyObject *reasons, *scopes;
    Plan *plan = PyMem_Calloc(1, sizeof(Plan));
    if (plan == NULL)
        return PyErr_NoMemory();
    if (!PyArg_ParseTuple(arg, "OO!O!", &plan->span_info, &PyTuple_Type, &reasons,
                          &PyTuple_Type, &scopes)
        || !PyArg_ParseTuple(reasons, "UUUU", &plan->r_ids, &plan->r_span_time,
                             &plan->r_wall, &plan->r_parent)) {
        PyMem_Free(plan);
        return NULL;
    }
    plan->owner = Py_NewRef(arg);
    plan->zero = PyLong_FromLong(0); /* immortal in practice (small int cache) */
    Py_DECREF(plan->zero);
    plan->nscopes = (int)PyTuple_GET_SIZE(scopes);
    plan->scopes = PyMem_Calloc(plan->nscopes ? plan->nscopes : 1, sizeof(ScopeSpec));
    if (plan->scopes == NULL) {
        plan_free(plan);
        return PyErr_NoMemory();
    }
    for (int i = 0; i < plan->nscopes; i++) {
        if (parse_scope(PyTuple_GET_ITEM(scopes, i), &plan->scopes[i])) {
            plan_free(plan);
            return NULL;
        }
    }
    PyObject *capsule = PyCapsule_New(plan, PLAN_CAPSULE, plan_capsule_free);
    if (capsule == NULL)
        plan_free(plan);
    return capsule;
}

/* ---------------------------------------------------------------------- decoding */

typedef struct {
    int which; /* AnyValue arm, A_NONE if unset or absent */
    int64_t i;
    double d;
    const uint8_t *s;
    Py_ssize_t slen;
} Slot;

typedef struct {
    const Plan *plan;
    PyObject *records;
    PyObject *reasons; /* a Counter: dict semantics */
    PyObject *source_of, *sample, *keep;
    long long rejected, ignored, rejected_spans, dropped_upstream, sampled_out;
} Ctx;

static int
count_reason(Ctx *c, PyObject *reason, long long n)
{
    PyObject *old = PyDict_GetItemWithError(c->reasons, reason);
    if (old == NULL && PyErr_Occurred())
        return D_ERR;
    long long base = old ? PyLong_AsLongLong(old) : 0;
    if (base == -1 && PyErr_Occurred())
        return D_ERR;
    PyObject *v = PyLong_FromLongLong(base + n);
    if (v == NULL)
        return D_ERR;
    int rc = PyDict_SetItem(c->reasons, reason, v);
    Py_DECREF(v);
    return rc ? D_ERR : D_OK;
}

/* Merge one encoded AnyValue into *s (protobuf: a repeated value field is merged, and
 * the last oneof arm set wins). */
static int
read_any(const uint8_t *p, const uint8_t *end, Slot *s)
{
    Field f = {0};
    int r;
    while ((r = next_field(&p, end, &f)) == 1) {
        switch (f.num) {
        case 1: case 5: case 6: case 7:
            if (f.wt != WT_LEN)
                return D_FALLBACK;
            s->which = (int)f.num;
            s->s = f.p;
            s->slen = f.len;
            break;
        case 2: case 3: case 8:
            if (f.wt != WT_VARINT)
                return D_FALLBACK;
            s->which = (int)f.num;
            s->i = (int64_t)f.v;
            break;
        case 4:
            if (f.wt != WT_I64)
                return D_FALLBACK;
            s->which = A_DOUBLE;
            memcpy(&s->d, &f.v, sizeof(double));
            break;
        default:
            return D_FALLBACK;
        }
    }
    return r < 0 ? D_FALLBACK : D_OK;
}

/* Read one encoded key/value entry into the slot of its key, if ``k`` has it (a later
 * entry of a key replaces an earlier one, as in a protobuf map). ``hint``: the slot to
 * try first, since keys usually arrive in the plan's order. */
static int
read_entry(const uint8_t *q, const uint8_t *qend, const KindSpec *k, int nslots, Slot *slots,
           int *hint)
{
    Field g = {0};
    const uint8_t *key = (const uint8_t *)"";
    Py_ssize_t klen = 0;
    Slot v = {0};
    int r;
    while ((r = next_field(&q, qend, &g)) == 1) {
        if (g.wt != WT_LEN || g.num > 2)
            return D_FALLBACK;
        if (g.num == 1) {
            key = g.p;
            klen = g.len;
        }
        else if (read_any(g.p, g.p + g.len, &v))
            return D_FALLBACK;
    }
    if (r < 0)
        return D_FALLBACK;
    for (int n = 0, i = *hint; n < nslots; n++, i = i + 1 == nslots ? 0 : i + 1) {
        const FieldSpec *fs = &k->fields[i];
        if (fs->klen == klen && memcmp(fs->key, key, klen) == 0) {
            slots[i] = v;
            *hint = i + 1 == nslots ? 0 : i + 1;
            break;
        }
    }
    return D_OK;
}

/* Read the key/value entries (field ``num`` of the message at p..end) into the slots
 * of ``k``'s keys. */
static int
read_attrs(const uint8_t *p, const uint8_t *end, uint32_t num, const KindSpec *k,
           int nslots, Slot *slots)
{
    Field f = {0};
    int r, hint = 0;
    memset(slots, 0, sizeof(Slot) * nslots);
    while ((r = next_field(&p, end, &f)) == 1) {
        if (f.num != num)
            continue;
        if (f.wt != WT_LEN || read_entry(f.p, f.p + f.len, k, nslots, slots, &hint))
            return D_FALLBACK;
    }
    return r < 0 ? D_FALLBACK : D_OK;
}

/* Python's round(): half to even. */
static double
py_round(double x)
{
    double r = round(x);
    if (fabs(x - r) == 0.5)
        r = 2.0 * round(x / 2.0);
    return r;
}

/* Convert one slot as attrs.compile_parser's code does. D_OK: *out is a new reference;
 * 1: rejected, *reason borrowed. */
static int
convert(const FieldSpec *f, const Slot *s, PyObject **out, PyObject **reason)
{
    double d;
    switch (f->type) {
    case T_INT:
    case T_NS: {
        uint64_t hi = f->type == T_INT ? MAX_COUNT_U : MAX_NS_U;
        if (s->which == A_INT) {
            if (s->i < 0 || (uint64_t)s->i > hi)
                goto range;
            *out = PyLong_FromLongLong(s->i);
            return *out ? D_OK : D_ERR;
        }
        if (s->which == A_NONE)
            goto missing;
        if (s->which != A_DOUBLE)
            goto type;
        d = s->d;
        if (!isfinite(d))
            goto nonfinite;
        if (d != floor(d))
            goto type;
        /* Python compares exactly: d > 2**63 - 1 holds from 2**63 on */
        if (d < 0 || (f->type == T_INT ? d > (double)MAX_COUNT_U : d >= 9223372036854775808.0))
            goto range;
        *out = PyLong_FromDouble(d);
        return *out ? D_OK : D_ERR;
    }
    case T_FLOAT:
    case T_SECONDS:
        if (s->which == A_DOUBLE) {
            d = s->d;
            if (d != 0.0 && d - d != 0.0)
                goto nonfinite;
            if (d == 0.0)
                d = 0.0; /* -0.0 reads as 0.0 */
        }
        else if (s->which == A_INT)
            d = (double)s->i;
        else if (s->which == A_NONE)
            goto missing;
        else
            goto type;
        if (f->type == T_FLOAT) {
            *out = PyFloat_FromDouble(d);
            return *out ? D_OK : D_ERR;
        }
        if (d < 0.0 || d > 9.2e9)
            goto range;
        *out = PyLong_FromDouble(py_round(d * 1e9));
        return *out ? D_OK : D_ERR;
    default: /* T_STR */
        if (s->which == A_STR) {
            *out = PyUnicode_DecodeUTF8((const char *)s->s, s->slen, NULL);
            if (*out == NULL) {
                PyErr_Clear();
                return D_FALLBACK;
            }
            return D_OK;
        }
        if (s->which == A_NONE)
            goto missing;
        goto type;
    }
missing:
    if (f->required) {
        *reason = f->r_missing;
        return 1;
    }
    *out = Py_NewRef(Py_None);
    return D_OK;
type:
    *reason = f->r_type;
    return 1;
nonfinite:
    *reason = f->r_nonfinite;
    return 1;
range:
    *reason = f->r_range;
    return 1;
}

static void
clear_args(PyObject **args, int from, int to)
{
    for (int i = from; i < to; i++)
        Py_CLEAR(args[i]);
}

/* Convert the fields ``idx`` (all when NULL) of ``k`` into args[at + i]; then the
 * kind's checks that follow the reads (journey fallback key, ratio bound). */
static int
convert_all(const KindSpec *k, const Slot *slots, const int *idx, int n, PyObject **args,
            int at, PyObject **reason)
{
    for (int j = 0; j < n; j++) {
        int i = idx ? idx[j] : j;
        int rc = convert(&k->fields[i], &slots[i], &args[at + j], reason);
        if (rc != D_OK) {
            clear_args(args, at, at + j);
            return rc;
        }
    }
    if (k->fallback && idx == NULL && args[at] == Py_None) {
        Py_CLEAR(args[at]);
        int rc = convert(&k->fields[k->nfields], &slots[k->nfields], &args[at], reason);
        if (rc == D_OK && args[at] == Py_None) {
            Py_CLEAR(args[at]);
            *reason = k->fields[0].r_missing;
            rc = 1;
        }
        if (rc != D_OK) {
            args[at] = NULL; /* convert() leaves it unset on a reject */
            clear_args(args, at, at + n);
            return rc;
        }
    }
    if (k->ratio_idx >= 0) {
        int j = k->ratio_idx;
        if (idx) {
            for (j = 0; j < n && idx[j] != k->ratio_idx; j++)
                ;
        }
        if (j < n && PyFloat_Check(args[at + j])) {
            double x = PyFloat_AS_DOUBLE(args[at + j]);
            if (x < 0.0 || x > 1.0) {
                *reason = k->fields[k->ratio_idx].r_range;
                clear_args(args, at, at + n);
                return 1;
            }
        }
    }
    return D_OK;
}

static int
append_record(Ctx *c, PyObject *ctor, PyObject **args, int nargs)
{
    PyObject *rec = PyObject_Vectorcall(ctor, args, nargs, NULL);
    if (rec == NULL)
        return D_ERR;
    int rc = PyList_Append(c->records, rec);
    Py_DECREF(rec);
    return rc ? D_ERR : D_OK;
}

/* A partially decoded summary (BatchSummary.partial): the kind's partial fields, the
 * step, 0 elsewhere, then True. */
static int
partial_event(Ctx *c, const KindSpec *k, const Slot *slots, PyObject *info, PyObject *wall,
              PyObject *step, PyObject **reason)
{
    PyObject *vals[MAX_FIELDS], *args[MAX_FIELDS + 4];
    int rc = convert_all(k, slots, k->partial, k->npartial, vals, 0, reason);
    if (rc != D_OK)
        return rc;
    int n = 0;
    args[n++] = info;
    args[n++] = wall;
    for (int i = 0; i < k->nfields; i++) {
        PyObject *v = c->plan->zero;
        if (i == k->step_idx)
            v = step;
        for (int j = 0; j < k->npartial; j++)
            if (k->partial[j] == i)
                v = vals[j];
        args[n++] = v;
    }
    args[n++] = Py_True;
    rc = append_record(c, k->ctor, args, n);
    clear_args(vals, 0, k->npartial);
    return rc;
}

/* Whether a shedding parser decodes this summary partially: keep(step) is False. */
static int
shed_step(Ctx *c, const KindSpec *k, const Slot *slots, PyObject **step)
{
    const Slot *s = &slots[k->step_idx];
    int64_t n = s->which == A_INT ? s->i : 0;
    if (n <= 0 || (uint64_t)n > MAX_COUNT_U)
        return 0;
    *step = PyLong_FromLongLong(n);
    if (*step == NULL)
        return D_ERR;
    PyObject *kept = PyObject_CallOneArg(c->keep, *step);
    int truth = kept ? PyObject_IsTrue(kept) : -1;
    Py_XDECREF(kept);
    if (truth < 0) {
        Py_CLEAR(*step);
        return D_ERR;
    }
    if (truth) {
        Py_CLEAR(*step);
        return 0;
    }
    return 1;
}

static int
reject_event(Ctx *c, PyObject *reason, int *flagged)
{
    c->rejected++;
    if (!*flagged) {
        c->rejected_spans++;
        *flagged = 1;
    }
    return count_reason(c, reason, 1);
}

static int
decode_event(Ctx *c, const ScopeSpec *sc, PyObject *info, const uint8_t *p,
             const uint8_t *end, int *flagged)
{
    Field f = {0};
    int r, nents = 0;
    const uint8_t *name = (const uint8_t *)"", *body = p, *ents[MAX_ENTRIES];
    Py_ssize_t nlen = 0, lens[MAX_ENTRIES];
    uint64_t wall = 0;
    /* one pass: the name says which keys to read, the entries are read after it */
    while ((r = next_field(&p, end, &f)) == 1) {
        if (f.num == 3) {
            if (f.wt != WT_LEN)
                return D_FALLBACK;
            if (nents < MAX_ENTRIES) {
                ents[nents] = f.p;
                lens[nents] = f.len;
            }
            nents++;
        }
        else if (f.num == 1) {
            if (f.wt != WT_I64)
                return D_FALLBACK;
            wall = f.v;
        }
        else if (f.num == 2) {
            if (f.wt != WT_LEN)
                return D_FALLBACK;
            name = f.p;
            nlen = f.len;
        }
    }
    if (r < 0)
        return D_FALLBACK;
    const KindSpec *k = NULL;
    for (int i = 0; i < sc->nevents; i++) {
        if (sc->events[i].nlen == nlen && memcmp(sc->events[i].name, name, nlen) == 0) {
            k = &sc->events[i];
            break;
        }
    }
    if (k == NULL) {
        c->ignored++;
        return D_OK;
    }
    if (wall == 0 || wall > MAX_NS_U)
        return reject_event(c, c->plan->r_wall, flagged);
    Slot slots[MAX_FIELDS + 1];
    int rc = D_OK, nslots = k->nfields + k->fallback, hint = 0;
    if (nents > MAX_ENTRIES)
        rc = read_attrs(body, end, 3, k, nslots, slots);
    else {
        memset(slots, 0, sizeof(Slot) * nslots);
        for (int i = 0; i < nents && rc == D_OK; i++)
            rc = read_entry(ents[i], ents[i] + lens[i], k, nslots, slots, &hint);
    }
    if (rc != D_OK)
        return rc;
    PyObject *reason = NULL, *step = NULL;
    PyObject *w = PyLong_FromUnsignedLongLong(wall);
    if (w == NULL)
        return D_ERR;
    if (k->shed && c->keep != Py_None && (rc = shed_step(c, k, slots, &step)) != 0) {
        if (rc == 1) {
            rc = partial_event(c, k, slots, info, w, step, &reason);
            Py_DECREF(step);
        }
    }
    else {
        PyObject *args[MAX_FIELDS + 4];
        int n = 0;
        args[n++] = info;
        if (k->kind)
            args[n++] = k->kind;
        args[n++] = w;
        rc = convert_all(k, slots, NULL, k->nfields, args, n, &reason);
        if (rc == D_OK) {
            rc = append_record(c, k->ctor, args, n + k->nfields);
            clear_args(args, n, n + k->nfields);
        }
    }
    Py_DECREF(w);
    return rc == 1 ? reject_event(c, reason, flagged) : rc;
}

typedef struct {
    const uint8_t *trace, *span, *parent, *name;
    Py_ssize_t tlen, slen, plen, nlen;
    uint64_t start, end, dropped;
    int status_code, nstatus;
    long long nevents;
} SpanHead;

static int
read_status(const uint8_t *p, const uint8_t *end, int *code)
{
    Field f = {0};
    int r;
    while ((r = next_field(&p, end, &f)) == 1) {
        if (f.num == 3) {
            if (f.wt != WT_VARINT)
                return D_FALLBACK;
            *code = (int32_t)f.v;
        }
    }
    return r < 0 ? D_FALLBACK : D_OK;
}

/* The span's own fields (ids, name, times, status) and its number of events. */
static int
read_span_head(const uint8_t *p, const uint8_t *end, SpanHead *h)
{
    Field f = {0};
    int r;
    memset(h, 0, sizeof(*h));
    h->trace = h->span = h->parent = h->name = (const uint8_t *)"";
    while ((r = next_field(&p, end, &f)) == 1) {
        int want = -1;
        switch (f.num) {
        case 1: h->trace = f.p; h->tlen = f.len; want = WT_LEN; break;
        case 2: h->span = f.p; h->slen = f.len; want = WT_LEN; break;
        case 4: h->parent = f.p; h->plen = f.len; want = WT_LEN; break;
        case 5: h->name = f.p; h->nlen = f.len; want = WT_LEN; break;
        case 7: h->start = f.v; want = WT_I64; break;
        case 8: h->end = f.v; want = WT_I64; break;
        case 9: want = WT_LEN; break;
        case 11: h->nevents++; want = WT_LEN; break;
        case 12: h->dropped = (uint32_t)f.v; want = WT_VARINT; break;
        case 15:
            if (f.wt != WT_LEN || h->nstatus++)
                return D_FALLBACK; /* a repeated message field is merged: Python's job */
            if (read_status(f.p, f.p + f.len, &h->status_code))
                return D_FALLBACK;
            want = WT_LEN;
            break;
        default: break;
        }
        if (want >= 0 && f.wt != want)
            return D_FALLBACK;
    }
    return r < 0 ? D_FALLBACK : D_OK;
}

static int
reject_span(Ctx *c, PyObject *reason, long long nevents)
{
    c->rejected += 1 + nevents;
    c->rejected_spans++;
    if (count_reason(c, reason, 1))
        return D_ERR;
    return nevents ? count_reason(c, c->plan->r_parent, nevents) : D_OK;
}

static PyObject *
span_info(Ctx *c, const SpanHead *h, const ScopeSpec *sc, PyObject *source)
{
    PyObject *name = PyUnicode_DecodeUTF8((const char *)h->name, h->nlen, NULL);
    if (name == NULL) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *a[9] = {
        PyBytes_FromStringAndSize((const char *)h->trace, h->tlen),
        PyBytes_FromStringAndSize((const char *)h->span, h->slen),
        PyBytes_FromStringAndSize((const char *)h->parent, h->plen),
        name,
        sc->name_obj,
        source,
        PyLong_FromUnsignedLongLong(h->start),
        PyLong_FromUnsignedLongLong(h->end),
        PyLong_FromUnsignedLongLong(h->dropped),
    };
    PyObject *info = NULL;
    if (a[0] && a[1] && a[2] && a[6] && a[7] && a[8])
        info = PyObject_Vectorcall(c->plan->span_info, a, 9, NULL);
    for (int i = 0; i < 9; i++)
        if (i != 4 && i != 5)
            Py_XDECREF(a[i]);
    return info;
}

static int
decode_span(Ctx *c, const ScopeSpec *sc, PyObject *source, const uint8_t *p,
            const uint8_t *end)
{
    SpanHead h;
    int rc = read_span_head(p, end, &h);
    if (rc != D_OK)
        return rc;
    const KindSpec *k = &sc->span;
    int accepted = sc->span_prefix ? h.nlen >= k->nlen && memcmp(h.name, k->name, k->nlen) == 0
                                   : h.nlen == k->nlen && memcmp(h.name, k->name, k->nlen) == 0;
    if (!accepted) {
        c->ignored += 1 + h.nevents;
        return D_OK;
    }
    if (h.tlen != 16 || h.slen != 8 || (h.plen != 0 && h.plen != 8))
        return reject_span(c, c->plan->r_ids, h.nevents);
    if (h.start == 0 || h.end == 0 || h.start > MAX_NS_U || h.end > MAX_NS_U)
        return reject_span(c, c->plan->r_span_time, h.nevents);
    Slot slots[MAX_FIELDS + 1];
    if ((rc = read_attrs(p, end, 9, k, k->nfields, slots)) != D_OK)
        return rc;
    PyObject *args[MAX_FIELDS + 4], *reason = NULL;
    if ((rc = convert_all(k, slots, NULL, k->nfields, args, 1, &reason)) != D_OK)
        return rc == 1 ? reject_span(c, reason, h.nevents) : rc;
    PyObject *info = args[0] = span_info(c, &h, sc, source);
    if (info == NULL) {
        clear_args(args, 1, 1 + k->nfields);
        return PyErr_Occurred() ? D_ERR : D_FALLBACK;
    }
    int n = 1 + k->nfields;
    if (k->status)
        args[n++] = h.status_code == 2 ? Py_True : Py_False; /* STATUS_CODE_ERROR */
    rc = append_record(c, k->ctor, args, n);
    clear_args(args, 1, 1 + k->nfields);
    if (rc == D_OK) {
        c->dropped_upstream += (long long)h.dropped;
        Field f = {0};
        int r, flagged = 0;
        while (rc == D_OK && (r = next_field(&p, end, &f)) == 1)
            if (f.num == 11 && f.wt == WT_LEN) /* read_span_head saw no other wire type */
                rc = decode_event(c, sc, info, f.p, f.p + f.len, &flagged);
    }
    Py_DECREF(info);
    return rc;
}

/* Spans and events of the spans of one ScopeSpans (message at p..end), for counting. */
static int
count_items(const uint8_t *p, const uint8_t *end, long long *n)
{
    Field f = {0}, g = {0};
    int r, r2;
    while ((r = next_field(&p, end, &f)) == 1) {
        if (f.num != 2)
            continue;
        if (f.wt != WT_LEN)
            return D_FALLBACK;
        *n += 1;
        const uint8_t *q = f.p, *qend = f.p + f.len;
        while ((r2 = next_field(&q, qend, &g)) == 1)
            *n += g.num == 11;
        if (r2 < 0)
            return D_FALLBACK;
    }
    return r < 0 ? D_FALLBACK : D_OK;
}

/* The (single) message field ``num`` of the message at p..end; NULL if absent. */
static int
singular(const uint8_t *p, const uint8_t *end, uint32_t num, const uint8_t **out,
         Py_ssize_t *len)
{
    Field f = {0};
    int r, seen = 0;
    *out = NULL;
    *len = 0;
    while ((r = next_field(&p, end, &f)) == 1) {
        if (f.num != num)
            continue;
        if (f.wt != WT_LEN || seen++)
            return D_FALLBACK; /* merged by protobuf: Python's job */
        *out = f.p;
        *len = f.len;
    }
    return r < 0 ? D_FALLBACK : D_OK;
}

static int
decode_scope_spans(Ctx *c, PyObject *source, const uint8_t *p, const uint8_t *end)
{
    const uint8_t *scope, *name = (const uint8_t *)"";
    Py_ssize_t slen, nlen = 0;
    Field f = {0};
    int r = 0, rc = singular(p, end, 1, &scope, &slen);
    if (rc != D_OK)
        return rc;
    if (scope != NULL) {
        const uint8_t *q = scope;
        while ((r = next_field(&q, scope + slen, &f)) == 1) {
            if (f.num == 1) {
                if (f.wt != WT_LEN)
                    return D_FALLBACK;
                name = f.p;
                nlen = f.len;
            }
        }
        if (r < 0)
            return D_FALLBACK;
    }
    const ScopeSpec *sc = NULL;
    for (int i = 0; i < c->plan->nscopes; i++) {
        const ScopeSpec *s = &c->plan->scopes[i];
        if (s->nlen == nlen && memcmp(s->name, name, nlen) == 0)
            sc = s;
    }
    if (sc == NULL) {
        long long n = 0;
        rc = count_items(p, end, &n);
        c->ignored += n;
        return rc;
    }
    while (rc == D_OK && (r = next_field(&p, end, &f)) == 1) {
        if (f.num != 2)
            continue;
        if (f.wt != WT_LEN)
            return D_FALLBACK;
        rc = decode_span(c, sc, source, f.p, f.p + f.len);
    }
    return rc != D_OK ? rc : (r < 0 ? D_FALLBACK : D_OK);
}

static int
decode_resource_spans(Ctx *c, const uint8_t *p, const uint8_t *end)
{
    const uint8_t *res;
    Py_ssize_t rlen;
    int rc = singular(p, end, 1, &res, &rlen), r = 0;
    if (rc != D_OK)
        return rc;
    PyObject *raw = PyBytes_FromStringAndSize((const char *)(res ? res : p), rlen);
    if (raw == NULL)
        return D_ERR;
    PyObject *source = PyObject_CallOneArg(c->source_of, raw);
    Py_DECREF(raw);
    if (source == NULL)
        return D_ERR;
    int keep = 1;
    if (c->sample != Py_None) {
        PyObject *k = PyObject_CallOneArg(c->sample, source);
        keep = k ? PyObject_IsTrue(k) : -1;
        Py_XDECREF(k);
        if (keep < 0) {
            Py_DECREF(source);
            return D_ERR;
        }
    }
    Field f = {0};
    while (rc == D_OK && (r = next_field(&p, end, &f)) == 1) {
        if (f.num != 2)
            continue;
        if (f.wt != WT_LEN)
            rc = D_FALLBACK;
        else if (keep)
            rc = decode_scope_spans(c, source, f.p, f.p + f.len);
        else
            rc = count_items(f.p, f.p + f.len, &c->sampled_out);
    }
    Py_DECREF(source);
    return rc != D_OK ? rc : (r < 0 ? D_FALLBACK : D_OK);
}

PyDoc_STRVAR(decode_doc,
"decode(data, plan, source_of, sample, keep, reasons) -> tuple | None\n\n"
"Records of an encoded ExportTraceServiceRequest (validated by upb beforehand), as\n"
"(records, rejected, ignored, rejected_spans, dropped_upstream, sampled_out), reject\n"
"reasons added to ``reasons``; None when the pure-Python decoder must decode it.");

static PyObject *
decode(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "decode() takes 6 arguments");
        return NULL;
    }
    Plan *plan = PyCapsule_GetPointer(args[1], PLAN_CAPSULE);
    if (plan == NULL)
        return NULL;
    if (!PyDict_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "reasons must be a dict");
        return NULL;
    }
    Py_buffer buf;
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_SIMPLE))
        return NULL;
    Ctx c = {plan, PyList_New(0), args[5], args[2], args[3], args[4], 0, 0, 0, 0, 0};
    int rc = c.records ? D_OK : D_ERR, r = 0;
    const uint8_t *p = buf.buf, *end = p + buf.len;
    Field f = {0};
    while (rc == D_OK && (r = next_field(&p, end, &f)) == 1) {
        if (f.num != 1)
            continue;
        rc = f.wt != WT_LEN ? D_FALLBACK : decode_resource_spans(&c, f.p, f.p + f.len);
    }
    if (rc == D_OK && r < 0)
        rc = D_FALLBACK;
    PyBuffer_Release(&buf);
    if (rc != D_OK) {
        Py_XDECREF(c.records);
        if (rc == D_ERR)
            return NULL;
        Py_RETURN_NONE;
    }
    return Py_BuildValue("(NLLLLL)", c.records, c.rejected, c.ignored, c.rejected_spans,
                         c.dropped_upstream, c.sampled_out);
}

static PyMethodDef methods[] = {
    {"compile_plan", compile_plan, METH_O, "Compile a decode plan (kinds.wire_plan)."},
    {"decode", (PyCFunction)(void (*)(void))decode, METH_FASTCALL, decode_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_wire", "OTLP wire bytes to coeffd records (see _wire.c).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__wire(void)
{
    return PyModule_Create(&module);
}
