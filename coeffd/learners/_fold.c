/* One RLS fold in C: the robust weights of a chunk of rows and their rank-m update of the
 * information (A, b), without numpy's fixed cost per call.
 *
 * Why: a learner folds every `refresh_every` (16) rows, and the arithmetic of a fold at
 * d = 11 is ~3,000 flops, while the ~25 numpy calls and per-row Python loops around it
 * cost tens of µs; the learning consumer folds three learners per 16 step observations
 * (issue 34). The pure-Python/numpy path in coeffd/learners/rls.py stays the reference
 * and the fallback (coeffd/learners/native.py picks): this file does the same operations
 * on the same IEEE doubles in the same order, so the weights, residual scale,
 * down-weighted count and drift residuals are the pure path's bit for bit. The two
 * matrix products are not redone here: BLAS sums them in its own order, and the ~1e-16
 * a different order leaves in (A, b) grows to ~1e-11 in the weakly identified directions
 * of β over a stream. So for d > 1 the caller passes numpy's ŷ = x θ_w and gets xc = x√c
 * and c·y back to add by the same BLAS calls as the pure path (bit-identical results);
 * for d = 1 (the α intercepts) the sums are made here in row order, as the pure path's
 * scalar fold (rls.RLSRegressor._fold_scalar) makes them. Compiled with
 * -ffp-contract=off: a fused multiply-add would round differently from Python's floats.
 * tests/learners/test_native_fold.py runs both paths on the same streams.
 *
 * fold(x, ys, ws, after, scale, a, b, theta_w, mode, huber, sigma_w, s_ew, g, clip, k,
 *      yhat, xc, cy)
 *   x        rows: a C-contiguous float64 buffer (m, d) or a list of m lists of d numbers
 *   ys, ws   lists of m floats: targets and weights (ws is not modified)
 *   after    list of m floats: each row's decay after it; scale: the statistics' scale
 *   a, b     the learner's A (d, d) and b (d,): C-contiguous float64, updated in place
 *            when xc is None
 *   theta_w  float64 buffer (d,): the weights' estimate
 *   mode     0: plain weights; 1: robust (Huber/drift) on absolute residuals; 2: relative
 *   huber    Huber threshold, or None
 *   sigma_w, s_ew, g, clip, k: residual scale, its EW value, its gain, clip, √(π/2)
 *   yhat     None (ŷ = x θ_w summed here) or a float64 buffer (m,) of the caller's ŷ
 *   xc, cy   None (accumulate here) or writable float64 buffers (m, d) and (m,) for
 *            x·√c and c·y (a and b untouched)
 * returns (accumulated, s_ew, n_down, clipped or None, c)
 *   accumulated  False when a row overflows once squared (|x√c| ≥ 1e150 or a non-finite
 *                Σ c·y): then a and b are untouched and the caller filters rows itself
 *   clipped      the clipped standardised residuals for the drift monitor (mode > 0)
 *   c            each row's weight in the scaled statistics (w · after / scale)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <string.h>

#define MAX_D 64
#define MAX_M 4096

/* Read a list of floats into out[0..n); -1 with an exception on error. */
static int read_floats(PyObject *seq, double *out, Py_ssize_t n, const char *what) {
    if (!PyList_Check(seq) || PyList_GET_SIZE(seq) != n) {
        PyErr_Format(PyExc_TypeError, "%s: expected a list of %zd floats", what, n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(seq, i);
        double d = PyFloat_CheckExact(v) ? PyFloat_AS_DOUBLE(v) : PyFloat_AsDouble(v);
        if (d == -1.0 && PyErr_Occurred()) return -1;
        out[i] = d;
    }
    return 0;
}

/* The rows: into x (m*d doubles, row-major). */
static int read_rows(PyObject *obj, double *x, Py_ssize_t m, Py_ssize_t d) {
    if (PyList_Check(obj)) {
        if (PyList_GET_SIZE(obj) != m) {
            PyErr_SetString(PyExc_ValueError, "rows: length differs from ys");
            return -1;
        }
        for (Py_ssize_t i = 0; i < m; i++) {
            if (read_floats(PyList_GET_ITEM(obj, i), x + i * d, d, "row") < 0) return -1;
        }
        return 0;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_ND) < 0)
        return -1;
    int bad = view.itemsize != 8 || view.format == NULL || strcmp(view.format, "d") != 0 ||
              view.ndim != 2 || view.shape[0] != m || view.shape[1] != d;
    if (!bad) memcpy(x, view.buf, (size_t)(m * d) * sizeof(double));
    PyBuffer_Release(&view);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "rows: expected a float64 (m, d) C-contiguous array");
        return -1;
    }
    return 0;
}

/* A writable C-contiguous float64 buffer of n doubles. */
static int get_out(PyObject *obj, Py_buffer *view, Py_ssize_t n, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0)
        return -1;
    if (view->itemsize != 8 || view->format == NULL || strcmp(view->format, "d") != 0 ||
        view->len != n * 8) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s: expected %zd float64 values", what, n);
        return -1;
    }
    return 0;
}

static PyObject *list_of(const double *v, Py_ssize_t n) {
    PyObject *out = PyList_New(n);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *f = PyFloat_FromDouble(v[i]);
        if (f == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, f);
    }
    return out;
}

static PyObject *fold(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 18) {
        PyErr_SetString(PyExc_TypeError, "fold: 18 arguments");
        return NULL;
    }
    PyObject *xs = args[0], *ys_o = args[1], *ws_o = args[2], *after_o = args[3];
    PyObject *a_o = args[5], *b_o = args[6], *theta_o = args[7], *huber_o = args[9];
    PyObject *yhat_o = args[15], *xc_o = args[16], *cy_o = args[17];
    double scale = PyFloat_AsDouble(args[4]);
    long mode = PyLong_AsLong(args[8]);
    double sigma_w = PyFloat_AsDouble(args[10]);
    double s_ew = PyFloat_AsDouble(args[11]);
    double g = PyFloat_AsDouble(args[12]);
    double clip = PyFloat_AsDouble(args[13]);
    double k = PyFloat_AsDouble(args[14]);
    if (PyErr_Occurred()) return NULL;
    int has_huber = huber_o != Py_None;
    double huber = has_huber ? PyFloat_AsDouble(huber_o) : 0.0;
    if (has_huber && huber == -1.0 && PyErr_Occurred()) return NULL;
    if (!PyList_Check(ys_o)) {
        PyErr_SetString(PyExc_TypeError, "ys: expected a list");
        return NULL;
    }
    Py_ssize_t m = PyList_GET_SIZE(ys_o);
    Py_buffer av, bv;
    if (PyObject_GetBuffer(b_o, &bv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0)
        return NULL;
    Py_ssize_t d = bv.len / 8;
    if (bv.itemsize != 8 || bv.format == NULL || strcmp(bv.format, "d") != 0 || d < 1 ||
        d > MAX_D || m < 1 || m > MAX_M) {
        PyBuffer_Release(&bv);
        PyErr_SetString(PyExc_ValueError, "fold: b must be float64 with 1..64 values, 1..4096 rows");
        return NULL;
    }
    if (get_out(a_o, &av, d * d, "a") < 0) {
        PyBuffer_Release(&bv);
        return NULL;
    }
    PyObject *result = NULL, *clipped = NULL, *c_list = NULL;
    double *x = PyMem_Malloc(sizeof(double) * (size_t)(m * d + 6 * m + d));
    if (x == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    double *y = x + m * d, *w = y + m, *aft = w + m, *c = aft + m, *e = c + m, *z = e + m;
    double *theta = z + m;
    if (read_rows(xs, x, m, d) < 0 || read_floats(ys_o, y, m, "ys") < 0 ||
        read_floats(ws_o, w, m, "ws") < 0 || read_floats(after_o, aft, m, "after") < 0)
        goto done;
    long n_down = 0;
    if (mode > 0) {
        Py_buffer tv;
        if (PyObject_GetBuffer(theta_o, &tv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto done;
        if (tv.len != d * 8 || tv.itemsize != 8 || tv.format == NULL || strcmp(tv.format, "d")) {
            PyBuffer_Release(&tv);
            PyErr_SetString(PyExc_ValueError, "theta_w: expected d float64 values");
            goto done;
        }
        memcpy(theta, tv.buf, sizeof(double) * (size_t)d);
        PyBuffer_Release(&tv);
        if (yhat_o != Py_None) {
            /* the caller's x θ_w (numpy's product: the pure path's very predictions) */
            Py_buffer hv;
            if (PyObject_GetBuffer(yhat_o, &hv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto done;
            int bad = hv.len != m * 8 || hv.itemsize != 8 || hv.format == NULL ||
                      strcmp(hv.format, "d") != 0;
            if (!bad) memcpy(z, hv.buf, sizeof(double) * (size_t)m);
            PyBuffer_Release(&hv);
            if (bad) {
                PyErr_SetString(PyExc_ValueError, "yhat: expected m float64 values");
                goto done;
            }
        }
        /* rls.RLSRegressor._robust_weights, operation for operation */
        for (Py_ssize_t i = 0; i < m; i++) {
            double p;
            if (yhat_o != Py_None) {
                p = z[i];
            } else {
                const double *xi = x + i * d;
                p = xi[0] * theta[0];
                for (Py_ssize_t j = 1; j < d; j++) p += xi[j] * theta[j];
            }
            double yi = y[i];
            if (mode == 2) {
                double ay = fabs(yi);
                double den = p >= 0.5 * ay ? p : ay;
                if (den < 1e-12) den = 1e-12;
                e[i] = (yi - p) / den;
                w[i] *= 1.0 / (den * den);
            } else {
                e[i] = yi - p;
            }
        }
        double cap = clip * sigma_w;
        for (Py_ssize_t i = 0; i < m; i++) {
            double zi = e[i] / sigma_w;
            if (has_huber) {
                double az = fabs(zi);
                if (az > huber) {
                    n_down++;
                    w[i] *= huber / (az > 1e-300 ? az : 1e-300);
                }
            }
            double ae = fabs(e[i]);
            s_ew += g * ((ae < cap ? ae : cap) * k - s_ew);
            z[i] = zi > clip ? clip : (zi < -clip ? -clip : zi);
        }
        clipped = list_of(z, m);
        if (clipped == NULL) goto done;
    }
    /* _fold_weights' row weights, then _accumulate */
    for (Py_ssize_t i = 0; i < m; i++) c[i] = w[i] * aft[i] / scale;
    c_list = list_of(c, m);
    if (c_list == NULL) goto done;
    int fine = 1;
    double sum_cy = 0.0;
    for (Py_ssize_t i = 0; i < m; i++) {
        double r = sqrt(c[i]);
        double *xi = x + i * d;
        for (Py_ssize_t j = 0; j < d; j++) {
            double v = xi[j] * r;
            if (!(fabs(v) < 1e150)) fine = 0;
        }
        sum_cy += c[i] * y[i];
    }
    if (!isfinite(sum_cy)) fine = 0;
    if (fine && xc_o != Py_None) {
        /* the caller adds xcᵀxc and xᵀcy by BLAS (the pure path's products, bit for bit) */
        Py_buffer xv, cv;
        if (get_out(xc_o, &xv, m * d, "xc") < 0) goto done;
        if (get_out(cy_o, &cv, m, "cy") < 0) {
            PyBuffer_Release(&xv);
            goto done;
        }
        double *XC = xv.buf, *CY = cv.buf;
        for (Py_ssize_t i = 0; i < m; i++) {
            double r = sqrt(c[i]);
            for (Py_ssize_t j = 0; j < d; j++) XC[i * d + j] = x[i * d + j] * r;
            CY[i] = c[i] * y[i];
        }
        PyBuffer_Release(&xv);
        PyBuffer_Release(&cv);
    } else if (fine) {
        double *A = av.buf, *B = bv.buf;
        double acc[MAX_D];
        /* A += xcᵀxc, upper triangle summed over rows in order, mirrored (symmetric) */
        for (Py_ssize_t j = 0; j < d; j++) {
            for (Py_ssize_t l = j; l < d; l++) acc[l] = 0.0;
            for (Py_ssize_t i = 0; i < m; i++) {
                double r = sqrt(c[i]);
                double xj = x[i * d + j] * r;
                const double *xi = x + i * d;
                for (Py_ssize_t l = j; l < d; l++) acc[l] += xj * (xi[l] * r);
            }
            for (Py_ssize_t l = j; l < d; l++) {
                A[j * d + l] += acc[l];
                if (l != j) A[l * d + j] += acc[l];
            }
        }
        /* b += xᵀ(c·y) */
        for (Py_ssize_t j = 0; j < d; j++) {
            double s = 0.0;
            for (Py_ssize_t i = 0; i < m; i++) s += x[i * d + j] * (c[i] * y[i]);
            B[j] += s;
        }
    }
    result = Py_BuildValue("(OdlOO)", fine ? Py_True : Py_False, s_ew, n_down,
                           clipped != NULL ? clipped : Py_None, c_list);
done:
    Py_XDECREF(clipped);
    Py_XDECREF(c_list);
    PyMem_Free(x);
    PyBuffer_Release(&av);
    PyBuffer_Release(&bv);
    return result;
}


/* A list of floats or a float64 buffer of n values into out (-1 with an exception). */
static int read_values(PyObject *obj, double *out, Py_ssize_t n, const char *what) {
    if (PyList_Check(obj)) return read_floats(obj, out, n, what);
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    int bad = v.len != n * 8 || v.itemsize != 8 || v.format == NULL || strcmp(v.format, "d") != 0;
    if (!bad) memcpy(out, v.buf, sizeof(double) * (size_t)n);
    PyBuffer_Release(&v);
    if (bad) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd float64 values", what, n);
        return -1;
    }
    return 0;
}

/* compare(ys, pfs, pss, g, f, s, b, bf, clip) -> (f, s, b, bf)
 * steady.SteadyEstimator._compare_rows' loop: the EW mean |relative error| of the fast
 * (f) and long-memory (s) predictions and their EW mean signed errors (bf, b), row by
 * row, with Python's max/min (the first argument unless the second compares greater /
 * smaller, so a NaN passes through as it does there). */
static PyObject *compare(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 9 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "compare: ys (a list) and 8 more arguments");
        return NULL;
    }
    Py_ssize_t m = PyList_GET_SIZE(args[0]);
    double g = PyFloat_AsDouble(args[3]), f = PyFloat_AsDouble(args[4]);
    double s = PyFloat_AsDouble(args[5]), b = PyFloat_AsDouble(args[6]);
    double bf = PyFloat_AsDouble(args[7]), clip = PyFloat_AsDouble(args[8]);
    if (PyErr_Occurred()) return NULL;
    double *buf = PyMem_Malloc(sizeof(double) * (size_t)(3 * m + 1));
    if (buf == NULL) return PyErr_NoMemory();
    double *y = buf, *pf = buf + m, *ps = buf + 2 * m;
    if (read_floats(args[0], y, m, "ys") < 0 || read_values(args[1], pf, m, "pfs") < 0 ||
        read_values(args[2], ps, m, "pss") < 0) {
        PyMem_Free(buf);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < m; i++) {
        double ay = fabs(y[i]);
        if (1e-12 > ay) ay = 1e-12;
        double a = (y[i] - pf[i]) / ay;
        if (-clip > a) a = -clip;
        if (clip < a) a = clip;
        double r = (y[i] - ps[i]) / ay;
        if (-clip > r) r = -clip;
        if (clip < r) r = clip;
        f = f != f ? fabs(a) : f + g * (fabs(a) - f);
        s = s != s ? fabs(r) : s + g * (fabs(r) - s);
        b += g * (r - b);
        bf += g * (a - bf);
    }
    PyMem_Free(buf);
    return Py_BuildValue("(dddd)", f, s, b, bf);
}

static PyMethodDef methods[] = {
    {"fold", (PyCFunction)(void (*)(void))fold, METH_FASTCALL,
     "One RLS fold: robust weights and the rank-m update of (A, b) (see _fold.c)."},
    {"compare", (PyCFunction)(void (*)(void))compare, METH_FASTCALL,
     "The steady pair's error comparison of a chunk of rows (see _fold.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fold", "One RLS fold in C (see _fold.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fold(void) { return PyModule_Create(&module); }
