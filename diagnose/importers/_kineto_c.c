/* The Kineto importer's native scan: one pass over a trace's JSON text that
 * builds Python objects only for the events the importer keeps.
 *
 * Why: decoding every event (msgspec structs, kineto_scan.py) costs ~0.2 s of
 * a 216k-event file, and ~85% of those events are CPU operators and flows that
 * the importer skips. Here a skipped event costs a validation pass and no
 * allocation.
 *
 * Contract (kineto_scan.native_scan wraps it): scan(text, gpu_only, other_phases,
 * launch_cats, sync_calls, classified_first, empty_args, decode) returns what
 * kineto_scan._scan gets from the msgspec decode, or None whenever the input is
 * anything but the plain case: invalid JSON, an escaped key, a type the
 * msgspec structs would refuse, a duplicate key, an integer beyond 64 bits,
 * nesting deeper than MAX_DEPTH. The caller then takes the msgspec path, which
 * is the reference. The caller passes ASCII text only (bytes.isascii()), so
 * no UTF-8 check is needed here.
 *
 * Returns (any_complete, base_time_span, distributed_info_span, gpu,
 * args_to_decode, launches, cpu_candidates, pids, nccl_ranges):
 *   spans            (start, end) of a value's JSON text, or None if absent
 *   gpu              (name, ts, dur, stream, correlation, bytes, collective?, args)
 *                    per GPU activity; args is empty_args unless the activity
 *                    carries other args the importer reads, in which case it is
 *                    None and args_to_decode holds (index, start, end) of its
 *                    args object, for the caller to decode with msgspec
 *   launches         {correlation: (ts, tid)} of runtime launches
 *   cpu_candidates   ("sync", name, ts, dur, "cuda") rows, and (name, cat, ts,
 *                    dur) of the events kineto._classify must look at, in order
 *   pids             {pid: events} of the CPU-side complete events
 *   nccl_ranges      (name, cat, ts, dur, tid, args span or None) of the CPU
 *                    events named "nccl:<op>" (unless gpu_only), in order
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 256
#define UNSUPPORTED ((const char *)0)

enum vtype { V_MISSING, V_NULL, V_STRING, V_INT, V_FLOAT, V_BOOL, V_OBJECT, V_ARRAY };

/* The fields of each tuple the scan returns (the contract above), by name: a
 * field moved here is moved in every tuple filled, none is read by its number. */
enum { GPU_NAME, GPU_TS, GPU_DUR, GPU_STREAM, GPU_CORRELATION, GPU_BYTES, GPU_COLLECTIVE, GPU_ARGS, GPU_FIELDS };
enum { SYNC_KIND, SYNC_NAME, SYNC_TS, SYNC_DUR, SYNC_DETAIL, SYNC_FIELDS };
enum { RANGE_NAME, RANGE_CAT, RANGE_TS, RANGE_DUR, RANGE_TID, RANGE_ARGS, RANGE_FIELDS };
enum { CANDIDATE_NAME, CANDIDATE_CAT, CANDIDATE_TS, CANDIDATE_DUR, CANDIDATE_FIELDS };

typedef struct {
    const char *start, *end; /* the value's text; for a string, inside the quotes */
    enum vtype type;
    int escaped;             /* a string with a backslash */
} Value;

static const char *ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    return p;
}

static int is_hex(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* Bytes that end a run of plain string characters: the quote, the backslash,
 * and the control characters JSON forbids inside strings. */
static unsigned char STRING_STOP[256];

static void init_tables(void) {
    for (int c = 0; c < 0x20; c++)
        STRING_STOP[c] = 1;
    STRING_STOP['"'] = STRING_STOP['\\'] = 1;
}

/* p at the opening quote; returns the position after the closing one */
static const char *string_end(const char *p, const char *end, Value *v) {
    p++;
    v->start = p;
    v->escaped = 0;
    for (;;) {
        while (p < end && !STRING_STOP[(unsigned char)*p])
            p++;
        if (p >= end || *p != '\\') {
            if (p >= end || *p != '"')
                return UNSUPPORTED; /* the end, or a control character */
            v->end = p;
            v->type = V_STRING;
            return p + 1;
        }
        v->escaped = 1;
        if (++p >= end)
            return UNSUPPORTED;
        if (*p == 'u') {
            if (end - p < 5 || !is_hex(p[1]) || !is_hex(p[2]) || !is_hex(p[3]) || !is_hex(p[4]))
                return UNSUPPORTED;
            p += 5;
        } else if (*p == '"' || *p == '\\' || *p == '/' || *p == 'b' || *p == 'f' || *p == 'n' || *p == 'r' ||
                   *p == 't') {
            p++;
        } else {
            return UNSUPPORTED;
        }
    }
}

static const char *digits(const char *p, const char *end) {
    const char *first = p;
    while (p < end && *p >= '0' && *p <= '9')
        p++;
    return p == first ? UNSUPPORTED : p;
}

/* JSON's number grammar: int unless it has a fraction or an exponent */
static const char *number_end(const char *p, const char *end, Value *v) {
    v->start = p;
    v->type = V_INT;
    if (p < end && *p == '-')
        p++;
    if (p < end && *p == '0')
        p++;
    else if ((p = digits(p, end)) == UNSUPPORTED)
        return UNSUPPORTED;
    if (p < end && *p == '.') {
        v->type = V_FLOAT;
        if ((p = digits(p + 1, end)) == UNSUPPORTED)
            return UNSUPPORTED;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        v->type = V_FLOAT;
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        if ((p = digits(p, end)) == UNSUPPORTED)
            return UNSUPPORTED;
    }
    v->end = p;
    return p;
}

static const char *literal_end(const char *p, const char *end, const char *word, enum vtype type, Value *v) {
    size_t n = strlen(word);
    if ((size_t)(end - p) < n || memcmp(p, word, n) != 0)
        return UNSUPPORTED;
    v->start = p;
    v->end = p + n;
    v->type = type;
    return p + n;
}

/* Validates one value at p (whitespace skipped); fills v; returns the position after it. */
static const char *value_end(const char *p, const char *end, Value *v, int depth) {
    Value inner;
    if (p >= end || depth > MAX_DEPTH)
        return UNSUPPORTED;
    switch (*p) {
    case '"':
        return string_end(p, end, v);
    case 't':
        return literal_end(p, end, "true", V_BOOL, v);
    case 'f':
        return literal_end(p, end, "false", V_BOOL, v);
    case 'n':
        return literal_end(p, end, "null", V_NULL, v);
    case '{':
    case '[': {
        char close = *p == '{' ? '}' : ']';
        v->start = p;
        v->type = *p == '{' ? V_OBJECT : V_ARRAY;
        p = ws(p + 1, end);
        if (p < end && *p == close) {
            v->end = p + 1;
            return p + 1;
        }
        for (;;) {
            if (close == '}') {
                if (p >= end || *p != '"' || (p = string_end(p, end, &inner)) == UNSUPPORTED)
                    return UNSUPPORTED;
                p = ws(p, end);
                if (p >= end || *p != ':')
                    return UNSUPPORTED;
                p = ws(p + 1, end);
            }
            if ((p = value_end(p, end, &inner, depth + 1)) == UNSUPPORTED)
                return UNSUPPORTED;
            p = ws(p, end);
            if (p < end && *p == ',') {
                p = ws(p + 1, end);
                continue;
            }
            if (p < end && *p == close) {
                v->end = p + 1;
                return p + 1;
            }
            return UNSUPPORTED;
        }
    }
    default:
        if (*p == '-' || (*p >= '0' && *p <= '9'))
            return number_end(p, end, v);
        return UNSUPPORTED;
    }
}

/* An object's members one by one: on return 1, key and value are the next member's. */
typedef struct {
    const char *p, *end;
    int first, depth;
} Members;

/* The next member's key; m->p is then at its value. 1: a member, 0: the
 * object ended, -1: unsupported. */
static int next_key(Members *m, Value *key) {
    const char *p = ws(m->p, m->end);
    if (p < m->end && *p == '}') {
        m->p = p + 1;
        return 0;
    }
    if (m->first)
        m->first = 0;
    else if (p < m->end && *p == ',')
        p = ws(p + 1, m->end);
    else
        return -1;
    if (p >= m->end || *p != '"' || (p = string_end(p, m->end, key)) == UNSUPPORTED || key->escaped)
        return -1;
    p = ws(p, m->end);
    if (p >= m->end || *p != ':')
        return -1;
    m->p = ws(p + 1, m->end);
    return 1;
}

static int next_member(Members *m, Value *key, Value *value) {
    int more = next_key(m, key);
    if (more == 1 && (m->p = value_end(m->p, m->end, value, m->depth)) == UNSUPPORTED)
        return -1;
    return more;
}

/* (a macro so that the name's length is a constant) */
#define key_is(key, name) \
    ((key)->end - (key)->start == sizeof(name) - 1 && memcmp((key)->start, name, sizeof(name) - 1) == 0)

static int text_is(const Value *v, PyObject *word) { /* word: bytes */
    return (Py_ssize_t)(v->end - v->start) == PyBytes_GET_SIZE(word) &&
           memcmp(v->start, PyBytes_AS_STRING(word), v->end - v->start) == 0;
}

static int text_in(const Value *v, PyObject *words) { /* words: tuple of bytes */
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(words); i++)
        if (text_is(v, PyTuple_GET_ITEM(words, i)))
            return 1;
    return 0;
}

/* 1 and *out set; 0: beyond 64 bits (unsupported) */
static int int64_of(const Value *v, long long *out) {
    const char *p = v->start;
    int negative = *p == '-';
    unsigned long long magnitude = 0;
    if (negative)
        p++;
    for (; p < v->end; p++) {
        unsigned digit = (unsigned)(*p - '0');
        if (magnitude > (ULLONG_MAX - digit) / 10)
            return 0;
        magnitude = magnitude * 10 + digit;
    }
    if (magnitude > (unsigned long long)LLONG_MAX + (negative ? 1u : 0u))
        return 0;
    *out = negative ? (long long)(0 - magnitude) : (long long)magnitude;
    return 1;
}

/* A number as Python int or float (as msgspec decodes it), NULL with no
 * exception set when unsupported. */
static PyObject *number_object(const Value *v) {
    if (v->type == V_INT) {
        long long n;
        return int64_of(v, &n) ? PyLong_FromLongLong(n) : NULL;
    }
    char text[64];
    size_t n = v->end - v->start;
    if (n >= sizeof text)
        return NULL;
    memcpy(text, v->start, n);
    text[n] = '\0';
    double d = PyOS_string_to_double(text, NULL, NULL);
    if (d == -1.0 && PyErr_Occurred()) { /* (not after the grammar check above; unsupported if ever) */
        PyErr_Clear();
        return NULL;
    }
    if (Py_IS_INFINITY(d)) /* (out of range: left to msgspec) */
        return NULL;
    return PyFloat_FromDouble(d);
}

/* A duration as the importer takes it: 0 if missing or below zero. */
static PyObject *dur_object(const Value *v) {
    if (v->type == V_MISSING)
        return PyLong_FromLong(0);
    PyObject *dur = number_object(v);
    if (dur != NULL && (PyFloat_Check(dur) ? PyFloat_AS_DOUBLE(dur) < 0 : *v->start == '-' && v->end - v->start > 1)) {
        Py_DECREF(dur); /* (an int's text starting with '-' is below zero unless it is "-0") */
        return PyLong_FromLong(0);
    }
    return dur;
}

static PyObject *string_object(const Value *v, PyObject *decode) {
    if (!v->escaped)
        return PyUnicode_FromStringAndSize(v->start, v->end - v->start);
    /* rare: msgspec decodes the escapes, quotes included; one it refuses (a
     * lone surrogate) makes the whole text unsupported */
    PyObject *decoded = PyObject_CallFunction(decode, "y#", v->start - 1, (Py_ssize_t)(v->end - v->start + 2));
    if (decoded == NULL && !PyErr_ExceptionMatches(PyExc_MemoryError))
        PyErr_Clear();
    return decoded;
}

typedef struct {
    int gpu_only;
    PyObject *other_phases, *launch_cats, *sync_calls, *classified_first, *empty_args, *decode; /* borrowed */
    const char *text;
    PyObject *gpu, *to_decode, *launches, *candidates, *pids, *ranges; /* owned */
    int any_complete;
    long long last_pid;
    Py_ssize_t last_pid_run; /* consecutive events of last_pid not yet added to pids */
} Scan;


static int flush_pid(Scan *s) {
    if (s->last_pid_run == 0)
        return 0;
    PyObject *key = PyLong_FromLongLong(s->last_pid);
    if (key == NULL)
        return -1;
    PyObject *count = PyDict_GetItemWithError(s->pids, key);
    Py_ssize_t before = count ? PyLong_AsSsize_t(count) : 0;
    PyObject *total = PyErr_Occurred() ? NULL : PyLong_FromSsize_t(before + s->last_pid_run);
    int rc = total ? PyDict_SetItem(s->pids, key, total) : -1;
    Py_DECREF(key);
    Py_XDECREF(total);
    s->last_pid_run = 0;
    return rc;
}

/* Appends a new tuple (steals the references; NULL items mean failure). */
static int append_tuple(PyObject *list, Py_ssize_t n, PyObject **items) {
    PyObject *t = PyTuple_New(n);
    int ok = t != NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (items[i] == NULL)
            ok = 0;
        if (t != NULL && items[i] != NULL)
            PyTuple_SET_ITEM(t, i, items[i]);
        else
            Py_XDECREF(items[i]);
    }
    int rc = ok ? PyList_Append(list, t) : -1;
    Py_XDECREF(t);
    return rc;
}

/* Returns 0 done, 1 unsupported, -1 Python error. */
/* An event's args: the object, and its members the importer reads, walked once. */
typedef struct {
    Value object, stream, correlation, nbytes;
    int other; /* 1: other keys of kineto_scan._Args; 3: "Collective name" among them */
} Args;

static const char *args_end(const char *p, const char *end, Args *a) {
    if (p >= end || *p != '{')
        return value_end(p, end, &a->object, 1);
    Members m = {p + 1, end, 1, 2};
    Value key, value;
    int more;
    while ((more = next_member(&m, &key, &value)) == 1) {
        Value *slot = key_is(&key, "stream") ? &a->stream : key_is(&key, "correlation") ? &a->correlation
                      : key_is(&key, "bytes") ? &a->nbytes : NULL;
        if (slot != NULL) {
            if (slot->type != V_MISSING)
                return UNSUPPORTED;
            *slot = value;
        } else if (key_is(&key, "Collective name")) {
            a->other = 3;
        } else if (key_is(&key, "Process Group Name") || key_is(&key, "Process Group Ranks") ||
                   key_is(&key, "Seq") || key_is(&key, "seq") || key_is(&key, "In msg nelems") ||
                   key_is(&key, "dtype") || key_is(&key, "Dst Rank") || key_is(&key, "Src Rank") ||
                   key_is(&key, "wait_on_stream") || key_is(&key, "wait_on_cuda_event_record_corr_id")) {
            /* (the peer keys too: a kernel whose op comes from its nccl:send
             * range may carry them without a "Collective name"; and a Stream
             * Wait Event's stream and event record, its "stream_wait" row) */
            a->other |= 1;
        }
    }
    if (more < 0)
        return UNSUPPORTED;
    a->object.start = p;
    a->object.end = m.p;
    a->object.type = V_OBJECT;
    return m.p;
}

/* A tid as msgspec decodes it (None if absent); NULL with no exception set
 * when unsupported here (a float, a bool, an object...). */
static PyObject *tid_object(const Value *tid, PyObject *decode) {
    if (tid->type == V_MISSING || tid->type == V_NULL)
        Py_RETURN_NONE;
    if (tid->type == V_STRING)
        return string_object(tid, decode);
    return tid->type == V_INT ? number_object(tid) : NULL;
}

/* Whether a name's text may decode to one that starts with "nccl:". */
static int may_be_nccl_range(const Value *name) {
    static const char prefix[] = "nccl:";
    Py_ssize_t n = name->end - name->start, plain = n;
    if (name->escaped) {
        const char *slash = memchr(name->start, '\\', n);
        plain = slash ? slash - name->start : n;
    }
    Py_ssize_t k = plain < 5 ? plain : 5;
    return memcmp(name->start, prefix, k) == 0 && (k == 5 || plain < n);
}

static int complete_event(Scan *s, Value *cat, Value *name, Value *ts, Value *dur, Value *pid, Value *tid, Args *a) {
    Value *args = &a->object, stream = a->stream, correlation = a->correlation, nbytes = a->nbytes;
    int other_args = a->other;
    /* types the msgspec structs accept, narrowed to what is handled here */
    if ((cat->type != V_MISSING && cat->type != V_NULL && (cat->type != V_STRING || cat->escaped)) ||
        (name->type != V_MISSING && name->type != V_NULL && name->type != V_STRING) ||
        (ts->type != V_MISSING && ts->type != V_NULL && ts->type != V_INT && ts->type != V_FLOAT) ||
        (dur->type != V_MISSING && dur->type != V_INT && dur->type != V_FLOAT) || pid->type == V_BOOL ||
        (args->type != V_MISSING && args->type != V_NULL && args->type != V_OBJECT) ||
        (stream.type != V_MISSING && stream.type != V_NULL && stream.type != V_INT) ||
        (correlation.type != V_MISSING && correlation.type != V_INT))
        return 1;
    long long stream_id = -1, correlation_id = -1, bytes_count = 0, pid_value;
    if ((stream.type == V_INT && !int64_of(&stream, &stream_id)) ||
        (correlation.type == V_INT && !int64_of(&correlation, &correlation_id)) ||
        (nbytes.type == V_INT && !int64_of(&nbytes, &bytes_count)) ||
        (pid->type == V_INT && !int64_of(pid, &pid_value)))
        return 1;
    s->any_complete = 1;
    if (name->type != V_STRING || ts->type == V_MISSING || ts->type == V_NULL)
        return 0;
    if (stream.type == V_INT && stream_id >= 0) {
        int needs_args = other_args || (nbytes.type != V_MISSING && nbytes.type != V_INT);
        if (needs_args) {
            PyObject *where[3] = {PyLong_FromSsize_t(PyList_GET_SIZE(s->gpu)),
                                  PyLong_FromSsize_t(args->start - s->text), PyLong_FromSsize_t(args->end - s->text)};
            if (append_tuple(s->to_decode, 3, where) < 0)
                return -1;
        }
        PyObject *ts_object = number_object(ts), *duration = dur_object(dur);
        if (ts_object == NULL || duration == NULL) {
            Py_XDECREF(ts_object);
            Py_XDECREF(duration);
            return PyErr_Occurred() ? -1 : 1;
        }
        PyObject *row[GPU_FIELDS] = {[GPU_NAME] = string_object(name, s->decode), [GPU_TS] = ts_object,
                                     [GPU_DUR] = duration, [GPU_STREAM] = PyLong_FromLongLong(stream_id),
                                     [GPU_CORRELATION] = PyLong_FromLongLong(correlation_id),
                                     [GPU_BYTES] = PyLong_FromLongLong(bytes_count > 0 ? bytes_count : 0),
                                     [GPU_COLLECTIVE] = PyBool_FromLong(other_args & 2),
                                     [GPU_ARGS] = needs_args ? Py_None : s->empty_args};
        Py_INCREF(row[GPU_ARGS]);
        return append_tuple(s->gpu, GPU_FIELDS, row) < 0 ? (PyErr_Occurred() ? -1 : 1) : 0;
    }
    if (pid->type == V_INT) {
        if (s->last_pid_run && pid_value != s->last_pid && flush_pid(s) < 0)
            return -1;
        s->last_pid = pid_value;
        s->last_pid_run++;
    }
    if (cat->type == V_STRING && text_in(cat, s->launch_cats)) {
        if (args->type == V_OBJECT && correlation.type == V_INT) {
            PyObject *key_object = PyLong_FromLongLong(correlation_id), *ts_object = number_object(ts);
            PyObject *tid_value = tid_object(tid, s->decode);
            PyObject *launch = ts_object && tid_value ? PyTuple_Pack(2, ts_object, tid_value) : NULL;
            int rc = key_object && launch ? PyDict_SetItem(s->launches, key_object, launch) : -1;
            Py_XDECREF(key_object);
            Py_XDECREF(ts_object);
            Py_XDECREF(tid_value);
            Py_XDECREF(launch);
            if (rc < 0)
                return PyErr_Occurred() ? -1 : 1;
        }
        if (!s->gpu_only && name->escaped)
            return 1; /* (could decode to a sync call's name: left to msgspec) */
        if (!s->gpu_only && text_in(name, s->sync_calls)) {
            PyObject *row[SYNC_FIELDS] = {[SYNC_KIND] = PyUnicode_FromString("sync"),
                                          [SYNC_NAME] = string_object(name, s->decode), [SYNC_TS] = number_object(ts),
                                          [SYNC_DUR] = dur_object(dur), [SYNC_DETAIL] = PyUnicode_FromString("cuda")};
            if (append_tuple(s->candidates, SYNC_FIELDS, row) < 0)
                return PyErr_Occurred() ? -1 : 1;
        }
        return 0;
    }
    if (s->gpu_only || name->end == name->start)
        return 0;
    if (may_be_nccl_range(name)) {
        if (name->escaped)
            return 1; /* (rare: left to msgspec) */
        PyObject *cat_object = cat->type == V_STRING ? string_object(cat, s->decode) : (Py_INCREF(Py_None), Py_None);
        PyObject *row[RANGE_FIELDS] = {
            [RANGE_NAME] = string_object(name, s->decode), [RANGE_CAT] = cat_object, [RANGE_TS] = number_object(ts),
            [RANGE_DUR] = dur_object(dur), [RANGE_TID] = tid_object(tid, s->decode),
            [RANGE_ARGS] = a->object.type == V_OBJECT ? Py_BuildValue("(nn)", (Py_ssize_t)(a->object.start - s->text),
                                                                      (Py_ssize_t)(a->object.end - s->text))
                                                      : (Py_INCREF(Py_None), Py_None)};
        return append_tuple(s->ranges, RANGE_FIELDS, row) < 0 ? (PyErr_Occurred() ? -1 : 1) : 0;
    }
    if (*name->start == '\\')
        return 1; /* its first character is an escape: left to msgspec */
    if (!memchr(PyBytes_AS_STRING(s->classified_first), *name->start, PyBytes_GET_SIZE(s->classified_first)))
        return 0;
    static const char annotation[] = "gpu_user_annotation";
    if (cat->type == V_STRING && cat->end - cat->start == sizeof annotation - 1 &&
        memcmp(cat->start, annotation, sizeof annotation - 1) == 0)
        return 0;
    PyObject *cat_object = cat->type == V_STRING ? string_object(cat, s->decode) : (Py_INCREF(Py_None), Py_None);
    PyObject *row[CANDIDATE_FIELDS] = {[CANDIDATE_NAME] = string_object(name, s->decode), [CANDIDATE_CAT] = cat_object,
                                       [CANDIDATE_TS] = number_object(ts), [CANDIDATE_DUR] = dur_object(dur)};
    if (append_tuple(s->candidates, CANDIDATE_FIELDS, row) < 0)
        return PyErr_Occurred() ? -1 : 1;
    return 0;
}

/* One element of traceEvents, p at '{'; returns the position after it, or UNSUPPORTED (*error set on a Python error). */
static const char *event_end(Scan *s, const char *p, const char *end, int *error) {
    Value ph = {0}, cat = {0}, name = {0}, ts = {0}, dur = {0}, pid = {0}, tid = {0}, key, value;
    Args args = {0};
    Members m = {p + 1, end, 1, 1};
    int more;
    while ((more = next_key(&m, &key)) == 1) {
        Value *slot = NULL;
        switch (key.end - key.start) {
        case 2: slot = key_is(&key, "ph") ? &ph : key_is(&key, "ts") ? &ts : NULL; break;
        case 3: slot = key_is(&key, "cat") ? &cat : key_is(&key, "dur") ? &dur : key_is(&key, "pid") ? &pid
                : key_is(&key, "tid") ? &tid : NULL; break;
        case 4:
            if (key_is(&key, "args")) {
                if (args.object.type != V_MISSING || (m.p = args_end(m.p, end, &args)) == UNSUPPORTED)
                    return UNSUPPORTED;
                continue;
            }
            slot = key_is(&key, "name") ? &name : NULL;
            break;
        }
        if ((m.p = value_end(m.p, end, &value, 1)) == UNSUPPORTED)
            return UNSUPPORTED;
        if (slot != NULL) {
            if (slot->type != V_MISSING)
                return UNSUPPORTED;
            *slot = value;
        }
    }
    if (more < 0 || ph.type != V_STRING || ph.escaped || ph.end - ph.start != 1)
        return UNSUPPORTED;
    if (*ph.start != 'X') /* one of the other phases msgspec knows, else unsupported */
        return memchr(PyBytes_AS_STRING(s->other_phases), *ph.start, PyBytes_GET_SIZE(s->other_phases))
                   ? m.p : UNSUPPORTED;
    int rc = complete_event(s, &cat, &name, &ts, &dur, &pid, &tid, &args);
    if (rc < 0)
        *error = 1;
    return rc == 0 ? m.p : UNSUPPORTED;
}

static PyObject *span_or_none(const Value *v, const char *text) {
    if (v->type == V_MISSING)
        Py_RETURN_NONE;
    return Py_BuildValue("(nn)", (Py_ssize_t)(v->start - text), (Py_ssize_t)(v->end - text));
}

static int scan_text(Scan *s, const char *text, const char *end, Value *base_time, Value *dist, int *error) {
    const char *p = ws(text, end);
    int have_events = 0;
    if (p >= end || *p != '{')
        return 1;
    Members top = {p + 1, end, 1, 1};
    Value key, value;
    int more;
    while ((more = next_key(&top, &key)) == 1) {
        p = top.p;
        if (key_is(&key, "traceEvents")) { /* walked event by event, not merely validated */
            if (have_events++ || p >= end || *p != '[')
                return 1;
            p = ws(p + 1, end);
            if (p < end && *p == ']')
                p++;
            else
                for (;;) {
                    if (p >= end || *p != '{' || (p = event_end(s, p, end, error)) == UNSUPPORTED)
                        return 1;
                    p = ws(p, end);
                    if (p < end && *p == ',') {
                        p = ws(p + 1, end);
                        continue;
                    }
                    if (p < end && *p == ']') {
                        p++;
                        break;
                    }
                    return 1;
                }
            top.p = p;
            continue;
        }
        if ((top.p = value_end(p, end, &value, 1)) == UNSUPPORTED)
            return 1;
        Value *slot = key_is(&key, "baseTimeNanoseconds") ? base_time : key_is(&key, "distributedInfo") ? dist : NULL;
        if (slot != NULL) {
            if (slot->type != V_MISSING)
                return 1;
            *slot = value;
            if (value.type == V_STRING) { /* the span of a string includes its quotes */
                slot->start--;
                slot->end++;
            }
        }
    }
    if (more < 0 || !have_events || ws(top.p, end) != end)
        return 1;
    return flush_pid(s) < 0 ? (*error = 1) : 0;
}

static PyObject *scan(PyObject *module, PyObject *arguments) {
    Py_buffer text;
    Scan s = {0};
    if (!PyArg_ParseTuple(arguments, "y*pO!O!O!O!OO", &text, &s.gpu_only, &PyBytes_Type, &s.other_phases, &PyTuple_Type,
                          &s.launch_cats, &PyTuple_Type, &s.sync_calls, &PyBytes_Type, &s.classified_first,
                          &s.empty_args, &s.decode))
        return NULL;
    s.text = text.buf;
    s.gpu = PyList_New(0);
    s.to_decode = PyList_New(0);
    s.launches = PyDict_New();
    s.candidates = PyList_New(0);
    s.pids = PyDict_New();
    s.ranges = PyList_New(0);
    PyObject *result = NULL;
    Value base_time = {0}, dist = {0};
    int error = 0;
    if (s.gpu && s.to_decode && s.launches && s.candidates && s.pids && s.ranges) {
        int rc = scan_text(&s, text.buf, (const char *)text.buf + text.len, &base_time, &dist, &error);
        if (error || PyErr_Occurred())
            result = NULL;
        else if (rc != 0)
            result = (Py_INCREF(Py_None), Py_None);
        else
            result = Py_BuildValue("(ONNOOOOOO)", s.any_complete ? Py_True : Py_False, span_or_none(&base_time, s.text),
                                   span_or_none(&dist, s.text), s.gpu, s.to_decode, s.launches, s.candidates, s.pids,
                                   s.ranges);
    }
    if (result == NULL && !PyErr_Occurred())
        PyErr_NoMemory();
    Py_XDECREF(s.gpu);
    Py_XDECREF(s.to_decode);
    Py_XDECREF(s.launches);
    Py_XDECREF(s.candidates);
    Py_XDECREF(s.pids);
    Py_XDECREF(s.ranges);
    PyBuffer_Release(&text);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "Scan a Kineto trace's JSON text (see the module's source for the contract)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kineto_c", "The Kineto importer's native scan.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__kineto_c(void) {
    init_tables();
    return PyModule_Create(&module);
}
