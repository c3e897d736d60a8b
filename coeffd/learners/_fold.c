/* One RLS fold in C: the robust weights of a chunk of rows and their rank-m update of the
 * information (A, b), without numpy's fixed cost per call.
 *
 * Why: a learner folds every `refresh_every` (16) rows, and the arithmetic of a fold at
 * d = 11 is ~3,000 flops, while the ~25 numpy calls and per-row Python loops around it
 * cost tens of µs; the learning consumer folds three learners per 16 step observations
 * (issue 34). The pure-Python/numpy path in coeffd/learners/rls.py stays the reference
 * and the fallback (coeffd/learners/native.py picks): the weights, residual scale,
 * down-weighted count and drift residuals are the same float operations in the same
 * order; the predictions x θ_w and the two products xcᵀxc and xᵀ(c·y) are summed here in
 * row order (BLAS sums in its own), and so are the solves below (LAPACK's Cholesky in
 * its). The contract with the pure path is therefore round-off, not bit identity: 1e-9
 * relative on every prediction and published vector (the ~1e-16 a fold leaves grows to
 * ~1e-11 in the weakly identified directions of β over a stream).
 * Compiled with -ffp-contract=off: a fused multiply-add would round the per-row
 * scalars differently from Python's floats.
 * tests/learners/test_native_fold.py runs both paths on the same streams.
 *
 * fold(x, ys, ws, after, scale, a, b, theta_w, mode, huber, sigma_w, s_ew, g, clip, k,
 *      yhat, xc, cy[, coef, pred])
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
 *   coef, pred  (optional, both or neither) a float64 buffer (d,) and a writable one (m,):
 *            the rows' prequential predictions x·coef are written to pred (before the fold)
 *   ws may be None: every weight 1
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


/* A C-contiguous float64 buffer of n doubles (writable with PyBUF_WRITABLE in flags). */
static int get_buf(PyObject *obj, Py_buffer *view, Py_ssize_t n, const char *what, int flags) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | flags) < 0) return -1;
    if (view->itemsize != 8 || view->format == NULL || strcmp(view->format, "d") != 0 ||
        view->len != n * 8) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s: expected %zd float64 values", what, n);
        return -1;
    }
    return 0;
}

static int get_out(PyObject *obj, Py_buffer *view, Py_ssize_t n, const char *what) {
    return get_buf(obj, view, n, what, PyBUF_WRITABLE);
}

static int get_in(PyObject *obj, Py_buffer *view, Py_ssize_t n, const char *what) {
    return get_buf(obj, view, n, what, 0);
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
    if (nargs != 18 && nargs != 20) {
        PyErr_SetString(PyExc_TypeError, "fold: 18 or 20 arguments");
        return NULL;
    }
    PyObject *coef_o = nargs == 20 ? args[18] : Py_None;
    PyObject *pred_o = nargs == 20 ? args[19] : Py_None;
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
        read_floats(after_o, aft, m, "after") < 0)
        goto done;
    if (ws_o == Py_None) {
        for (Py_ssize_t i = 0; i < m; i++) w[i] = 1.0;
    } else if (read_floats(ws_o, w, m, "ws") < 0) {
        goto done;
    }
    if (coef_o != Py_None) {
        /* the prequential predictions x·coef (coefficients as of the last fold) into pred */
        Py_buffer cv, pv;
        if (get_in(coef_o, &cv, d, "coef") < 0) goto done;
        if (get_out(pred_o, &pv, m, "pred") < 0) {
            PyBuffer_Release(&cv);
            goto done;
        }
        const double *cf = cv.buf;
        double *P = pv.buf;
        for (Py_ssize_t i = 0; i < m; i++) {
            const double *xi = x + i * d;
            double p = xi[0] * cf[0];
            for (Py_ssize_t j = 1; j < d; j++) p += xi[j] * cf[j];
            P[i] = p;
        }
        PyBuffer_Release(&cv);
        PyBuffer_Release(&pv);
    }
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


/* ---------------------------------------------------------------------------------------
 * The solves (issue 34, second step). The information matrices are at most 64×64 (11 for
 * β, 21 for the extended basis); numpy spends ~10 µs of argument checks and error-state
 * bookkeeping around each ~1 µs LAPACK call, and a learner solves once per fold plus an
 * NNLS (a few sub-solves) whenever its unconstrained estimate has a negative term. These
 * are plain Cholesky solves: they sum in another order than LAPACK, so results differ
 * from the pure path at round-off (the compiled/pure contract is 1e-9 relative, see
 * tests/learners/test_native_fold.py). Anything unusual (a matrix not positive definite, a
 * NaN) returns 0 and the caller takes the pure path, which has the lstsq fallbacks.
 */

/* Cholesky factor (lower, row-major, n×n) of the symmetric a; 0 when not positive definite. */
static int cholesky(const double *a, double *l, Py_ssize_t n) {
    for (Py_ssize_t j = 0; j < n; j++) {
        double s = a[j * n + j];
        for (Py_ssize_t k = 0; k < j; k++) s -= l[j * n + k] * l[j * n + k];
        if (!(s > 0.0) || !isfinite(s)) return 0;
        double ljj = sqrt(s);
        l[j * n + j] = ljj;
        for (Py_ssize_t i = j + 1; i < n; i++) {
            double t = a[i * n + j];
            for (Py_ssize_t k = 0; k < j; k++) t -= l[i * n + k] * l[j * n + k];
            l[i * n + j] = t / ljj;
        }
        for (Py_ssize_t i = 0; i < j; i++) l[i * n + j] = 0.0;
    }
    return 1;
}

/* x = (L Lᵀ)⁻¹ b by the two triangular solves; x may be b. */
static void chol_solve(const double *l, const double *b, double *x, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        double t = b[i];
        for (Py_ssize_t k = 0; k < i; k++) t -= l[i * n + k] * x[k];
        x[i] = t / l[i * n + i];
    }
    for (Py_ssize_t i = n - 1; i >= 0; i--) {
        double t = x[i];
        for (Py_ssize_t k = i + 1; k < n; k++) t -= l[k * n + i] * x[k];
        x[i] = t / l[i * n + i];
    }
}

/* Solve the sub-system of a (n×n) and b on the indices idx[0..k): out[0..k); 0 on failure. */
static int sub_solve(const double *a, const double *b, Py_ssize_t n, const Py_ssize_t *idx,
                     Py_ssize_t k, double *out, double *work) {
    double *s = work, *l = work + k * k;
    for (Py_ssize_t i = 0; i < k; i++) {
        for (Py_ssize_t j = 0; j < k; j++) s[i * k + j] = a[idx[i] * n + idx[j]];
        out[i] = b[idx[i]];
    }
    if (!cholesky(s, l, k)) return 0;
    chol_solve(l, out, out, k);
    for (Py_ssize_t i = 0; i < k; i++)
        if (!isfinite(out[i])) return 0;
    return 1;
}


/* solve(a, b, scale, a0, b0, pw, atot, btot, theta) -> bool
 * The learner's total information atot = scale·a + pw·a0, btot = scale·b + pw·b0 (written,
 * the same sums as RLSRegressor._folded_information) and θ = atot⁻¹ btot into theta; False
 * when atot is not positive definite or θ is not finite (atot and btot are written anyway:
 * the caller's fallback solves them). */
static PyObject *solve(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "solve: 9 arguments");
        return NULL;
    }
    double scale = PyFloat_AsDouble(args[2]), pw = PyFloat_AsDouble(args[5]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer bv;
    if (PyObject_GetBuffer(args[1], &bv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    Py_ssize_t d = bv.len / 8;
    PyBuffer_Release(&bv);
    if (d < 1 || d > MAX_D) {
        PyErr_SetString(PyExc_ValueError, "solve: 1..64 features");
        return NULL;
    }
    Py_buffer v[7];
    Py_ssize_t sizes[7] = {d * d, d, d * d, d, d * d, d, d};
    int which[7] = {0, 1, 3, 4, 6, 7, 8};
    int got = 0, ok = 0;
    for (; got < 7; got++) {
        int rc = got < 4 ? get_in(args[which[got]], &v[got], sizes[got], "solve")
                         : get_out(args[which[got]], &v[got], sizes[got], "solve");
        if (rc < 0) goto done;
    }
    {
        const double *A = v[0].buf, *B = v[1].buf, *A0 = v[2].buf, *B0 = v[3].buf;
        double *AT = v[4].buf, *BT = v[5].buf, *T = v[6].buf;
        double l[MAX_D * MAX_D];
        for (Py_ssize_t i = 0; i < d * d; i++) AT[i] = scale * A[i] + pw * A0[i];
        for (Py_ssize_t i = 0; i < d; i++) BT[i] = scale * B[i] + pw * B0[i];
        if (cholesky(AT, l, d)) {
            chol_solve(l, BT, T, d);
            ok = 1;
            for (Py_ssize_t i = 0; i < d; i++)
                if (!isfinite(T[i])) ok = 0;
        }
    }
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&v[i]);
    if (PyErr_Occurred()) return NULL;
    return PyBool_FromLong(ok);
}

/* nnls(a, b, warm, theta, tol) -> bool
 * learners.nnls.nnls_information (Lawson–Hanson on the information form, warm-started
 * from the positive set warm: a bool array or None), step for step, into theta. False
 * when a sub-system is not positive definite or a step is undefined (a NaN): the caller
 * runs the pure version, whose lstsq fallback handles those. */
/* Lawson–Hanson on (a, b) (n×n, n), warm-started from passive[] (modified), into theta;
 * 0 when a sub-system is not positive definite or a step is undefined. */
static int nnls_core(const double *a, const double *b, Py_ssize_t n, int *passive, int has_warm,
                     double tol, double *theta) {
    double grad[MAX_D], z[MAX_D], zs[MAX_D], work[2 * MAX_D * MAX_D];
    Py_ssize_t idx[MAX_D] = {0}, k = 0;
    int ok = 1;
    double scale = 0.0;
    for (Py_ssize_t i = 0; i < n; i++) scale = fabs(b[i]) > scale ? fabs(b[i]) : scale;
    double amax = 0.0;
    for (Py_ssize_t i = 0; i < n * n; i++) amax = fabs(a[i]) > amax ? fabs(a[i]) : amax;
    if (amax > scale) scale = amax;
    double eps = tol * (scale > 0 ? scale : 1.0);
    for (Py_ssize_t i = 0; i < n; i++) {
        theta[i] = 0.0;
        grad[i] = b[i];
    }
#define GRAD()                                                                \
    for (Py_ssize_t i = 0; i < n; i++) {                                      \
        double t = 0.0;                                                       \
        for (Py_ssize_t j = 0; j < n; j++) t += a[i * n + j] * theta[j];      \
        grad[i] = b[i] - t;                                                   \
    }
    if (has_warm) {
        int any = 1;
        for (;;) {
            k = 0;
            for (Py_ssize_t i = 0; i < n; i++)
                if (passive[i]) idx[k++] = i;
            if (!sub_solve(a, b, n, idx, k, zs, work)) {
                ok = 0;
                goto out;
            }
            int all = 1;
            for (Py_ssize_t i = 0; i < k; i++)
                if (!(zs[i] > 0)) {
                    all = 0;
                    passive[idx[i]] = 0;
                }
            if (all) break;
            any = 0;
            for (Py_ssize_t i = 0; i < n; i++) any |= passive[i];
            if (!any) break;
        }
        if (any) {
            for (Py_ssize_t i = 0; i < k; i++) theta[idx[i]] = zs[i];
            GRAD();
            double gmax = -INFINITY;
            for (Py_ssize_t i = 0; i < n; i++) {
                if (passive[i]) continue;
                if (grad[i] != grad[i]) {
                    ok = 0;
                    goto out;
                }
                if (grad[i] > gmax) gmax = grad[i];
            }
            if (gmax <= eps) goto out;
        }
    }
    {
        long iterations = 0, limit = 3 * (long)n + 10;
        while (iterations < limit) {
            Py_ssize_t j = -1;
            for (Py_ssize_t i = 0; i < n; i++) {
                if (passive[i]) continue;
                if (grad[i] != grad[i]) {
                    ok = 0; /* a NaN gradient: the pure path */
                    goto out;
                }
                if (j < 0 || grad[i] > grad[j]) j = i;
            }
            if (j < 0 || !(grad[j] > eps)) break;
            passive[j] = 1;
            for (;;) {
                iterations++;
                k = 0;
                for (Py_ssize_t i = 0; i < n; i++) {
                    z[i] = 0.0;
                    if (passive[i]) idx[k++] = i;
                }
                if (!sub_solve(a, b, n, idx, k, zs, work)) {
                    ok = 0;
                    goto out;
                }
                int all = 1;
                for (Py_ssize_t i = 0; i < k; i++) {
                    z[idx[i]] = zs[i];
                    if (!(zs[i] > 0)) all = 0;
                }
                if (all || iterations >= limit) {
                    for (Py_ssize_t i = 0; i < n; i++)
                        theta[i] = passive[i] ? (z[i] > 0.0 ? z[i] : 0.0) : 0.0;
                    break;
                }
                double alpha = INFINITY;
                int seen = 0;
                for (Py_ssize_t i = 0; i < n; i++) {
                    if (!(passive[i] && z[i] <= 0)) continue;
                    double den = theta[i] - z[i];
                    double r = den > 0 ? theta[i] / den : 1.0;
                    if (r < alpha || !seen) alpha = r;
                    seen = 1;
                }
                if (!seen || alpha != alpha) {
                    ok = 0;
                    goto out;
                }
                int any = 0;
                for (Py_ssize_t i = 0; i < n; i++) {
                    theta[i] = theta[i] + alpha * (z[i] - theta[i]);
                    passive[i] = passive[i] && theta[i] > eps * 1e-3;
                    if (!passive[i]) theta[i] = 0.0;
                    any |= passive[i];
                }
                if (!any) break;
            }
            GRAD();
        }
    }
#undef GRAD
out:
    return ok;
}

static PyObject *nnls(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "nnls: 5 arguments");
        return NULL;
    }
    double tol = PyFloat_AsDouble(args[4]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer bv, av, tv, wv;
    if (PyObject_GetBuffer(args[1], &bv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    Py_ssize_t n = bv.len / 8;
    if (bv.itemsize != 8 || bv.format == NULL || strcmp(bv.format, "d") != 0 || n < 1 ||
        n > MAX_D) {
        PyBuffer_Release(&bv);
        PyErr_SetString(PyExc_ValueError, "nnls: b must be float64 with 1..64 values");
        return NULL;
    }
    if (get_in(args[0], &av, n * n, "nnls a") < 0) {
        PyBuffer_Release(&bv);
        return NULL;
    }
    if (get_out(args[3], &tv, n, "nnls theta") < 0) {
        PyBuffer_Release(&bv);
        PyBuffer_Release(&av);
        return NULL;
    }
    int passive[MAX_D], has_warm = 0;
    memset(passive, 0, sizeof passive);
    if (args[2] != Py_None) {
        if (PyObject_GetBuffer(args[2], &wv, PyBUF_C_CONTIGUOUS) < 0 || wv.len != n) {
            if (!PyErr_Occurred()) {
                PyBuffer_Release(&wv);
                PyErr_SetString(PyExc_ValueError, "nnls: warm must be n bools");
            }
            PyBuffer_Release(&bv);
            PyBuffer_Release(&av);
            PyBuffer_Release(&tv);
            return NULL;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            passive[i] = ((const char *)wv.buf)[i] != 0;
            has_warm |= passive[i];
        }
        PyBuffer_Release(&wv);
    }
    int ok = nnls_core(av.buf, bv.buf, n, passive, has_warm, tol, tv.buf);
    PyBuffer_Release(&bv);
    PyBuffer_Release(&av);
    PyBuffer_Release(&tv);
    return PyBool_FromLong(ok);
}

/* refit(xring, yring, i, k, blocks, slot, count, warm, theta) -> bool
 * learners.evaluation.WindowedRefit.refit by blocks: the information (1/y² weights) of
 * the k rows appended last to the window's rings (xring float32 (size, d), yring float64
 * (size,), i the rings' next write index) goes to row slot of blocks (float64 (nb, d·d +
 * d): [A | b] of each refit's rows); the first count rows of blocks are summed, given the
 * batch refit's tiny ridge (1e-12 · max(trace, 1e-300) on the diagonal) and solved by the
 * NNLS above, warm-started from warm (bools or None), into theta. One call instead of
 * ~20 numpy calls a refit. False when the NNLS declines (the caller refits the window
 * the pure way; the block is written either way). */
static PyObject *refit(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "refit: 9 arguments");
        return NULL;
    }
    Py_ssize_t i0 = PyLong_AsSsize_t(args[2]), k = PyLong_AsSsize_t(args[3]);
    Py_ssize_t slot = PyLong_AsSsize_t(args[5]), count = PyLong_AsSsize_t(args[6]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer xv, yv, bv, tv;
    if (PyObject_GetBuffer(args[0], &xv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_ND) < 0)
        return NULL;
    if (xv.itemsize != 4 || xv.format == NULL || strcmp(xv.format, "f") != 0 || xv.ndim != 2 ||
        xv.shape[1] < 1 || xv.shape[1] > MAX_D) {
        PyBuffer_Release(&xv);
        PyErr_SetString(PyExc_ValueError, "refit: xring must be float32 (size, 1..64)");
        return NULL;
    }
    Py_ssize_t size = xv.shape[0], d = xv.shape[1], row = d * d + d;
    if (get_in(args[1], &yv, size, "refit yring") < 0) {
        PyBuffer_Release(&xv);
        return NULL;
    }
    if (PyObject_GetBuffer(args[4], &bv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&xv);
        PyBuffer_Release(&yv);
        return NULL;
    }
    Py_ssize_t nb = bv.len / (row * 8);
    if (get_out(args[8], &tv, d, "refit theta") < 0) {
        PyBuffer_Release(&xv);
        PyBuffer_Release(&yv);
        PyBuffer_Release(&bv);
        return NULL;
    }
    int passive[MAX_D], has_warm = 0, ok = 0;
    memset(passive, 0, sizeof passive);
    if (bv.itemsize != 8 || bv.format == NULL || strcmp(bv.format, "d") != 0 ||
        bv.len != nb * row * 8 || slot < 0 || slot >= nb || count < 1 || count > nb || k < 1 ||
        k > size || i0 < 0 || i0 > size) {
        PyErr_SetString(PyExc_ValueError, "refit: blocks, slot, count or k out of range");
        goto done;
    }
    if (args[7] != Py_None) {
        Py_buffer wv;
        if (PyObject_GetBuffer(args[7], &wv, PyBUF_C_CONTIGUOUS) < 0) goto done;
        if (wv.len != d) {
            PyBuffer_Release(&wv);
            PyErr_SetString(PyExc_ValueError, "refit: warm must be d bools");
            goto done;
        }
        for (Py_ssize_t j = 0; j < d; j++) {
            passive[j] = ((const char *)wv.buf)[j] != 0;
            has_warm |= passive[j];
        }
        PyBuffer_Release(&wv);
    }
    {
        const float *X = xv.buf;
        const double *Y = yv.buf;
        double *B = bv.buf, *blk = B + slot * row;
        double x[MAX_D];
        memset(blk, 0, sizeof(double) * (size_t)row);
        for (Py_ssize_t r = 0; r < k; r++) {
            Py_ssize_t at = (i0 - k + r + size) % size;
            double y = Y[at], w = 1.0 / (y * y), wy = w * y;
            for (Py_ssize_t j = 0; j < d; j++) x[j] = (double)X[at * d + j];
            for (Py_ssize_t j = 0; j < d; j++) {
                double xw = x[j] * w;
                for (Py_ssize_t l = j; l < d; l++) blk[j * d + l] += xw * x[l];
                blk[d * d + j] += x[j] * wy;
            }
        }
        for (Py_ssize_t j = 0; j < d; j++)
            for (Py_ssize_t l = j + 1; l < d; l++) blk[l * d + j] = blk[j * d + l];
        double a[MAX_D * MAX_D], b[MAX_D];
        memcpy(a, B, sizeof(double) * (size_t)(d * d));
        memcpy(b, B + d * d, sizeof(double) * (size_t)d);
        for (Py_ssize_t q = 1; q < count; q++) {
            const double *o = B + q * row;
            for (Py_ssize_t j = 0; j < d * d; j++) a[j] += o[j];
            for (Py_ssize_t j = 0; j < d; j++) b[j] += o[d * d + j];
        }
        double tr = 0.0;
        for (Py_ssize_t j = 0; j < d; j++) tr += a[j * d + j];
        double ridge = 1e-12 * (tr > 1e-300 ? tr : 1e-300);
        for (Py_ssize_t j = 0; j < d; j++) a[j * d + j] += ridge;
        ok = nnls_core(a, b, d, passive, has_warm, 1e-10, tv.buf);
    }
done:
    PyBuffer_Release(&xv);
    PyBuffer_Release(&yv);
    PyBuffer_Release(&bv);
    PyBuffer_Release(&tv);
    if (PyErr_Occurred()) return NULL;
    return PyBool_FromLong(ok);
}

/* feed(update, values, start) -> int
 * Call update(v) for v in values[start:] (a list of floats) until it returns true; the
 * index of that value, or -1. The drift monitor's loop over a fold's residuals into
 * ADWIN's window (learners.drift.DriftMonitor.update_many): the window's update is a
 * compiled call of ~0.1 µs, the Python loop around it was several times that, for every
 * row of every learner. */
static PyObject *feed(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3 || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "feed: update, a list of floats, start");
        return NULL;
    }
    PyObject *fn = args[0], *values = args[1];
    Py_ssize_t start = PyLong_AsSsize_t(args[2]);
    if (start == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(values);
    for (Py_ssize_t j = start < 0 ? 0 : start; j < n; j++) {
        PyObject *v = PyList_GET_ITEM(values, j);
        PyObject *f = PyFloat_CheckExact(v) ? (Py_INCREF(v), v) : PyNumber_Float(v);
        if (f == NULL) return NULL;
        PyObject *r = PyObject_CallOneArg(fn, f);
        Py_DECREF(f);
        if (r == NULL) return NULL;
        int hit = PyObject_IsTrue(r);
        Py_DECREF(r);
        if (hit < 0) return NULL;
        if (hit) return PyLong_FromSsize_t(j);
    }
    return PyLong_FromLong(-1);
}

static PyMethodDef methods[] = {
    {"fold", (PyCFunction)(void (*)(void))fold, METH_FASTCALL,
     "One RLS fold: robust weights and the rank-m update of (A, b) (see _fold.c)."},
    {"compare", (PyCFunction)(void (*)(void))compare, METH_FASTCALL,
     "The steady pair's error comparison of a chunk of rows (see _fold.c)."},
    {"solve", (PyCFunction)(void (*)(void))solve, METH_FASTCALL,
     "A learner's total information and its Cholesky solve (see _fold.c)."},
    {"refit", (PyCFunction)(void (*)(void))refit, METH_FASTCALL,
     "The batch refit by blocks and NNLS (see _fold.c)."},
    {"feed", (PyCFunction)(void (*)(void))feed, METH_FASTCALL,
     "Feed values to a detector's update until it alarms (see _fold.c)."},
    {"nnls", (PyCFunction)(void (*)(void))nnls, METH_FASTCALL,
     "Lawson-Hanson NNLS on the information form (see _fold.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fold", "One RLS fold in C (see _fold.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fold(void) { return PyModule_Create(&module); }
