/*
 * graph_runtime, C++ shim basics: turning exceptions into error codes and one-line messages,
 * dtype mapping, and runtime-wide settings.
 */
#include "engine_int.h"

#include <new>

#include <ATen/Parallel.h>
#include <torch/version.h>

namespace gr
{

namespace
{

const size_t MESSAGE_MAX = 480;

std::vector<std::string> split_lines(const std::string &s)
{
    std::vector<std::string> lines;
    size_t start = 0;
    while (start <= s.size()) {
        size_t end = s.find('\n', start);
        if (end == std::string::npos)
            end = s.size();
        std::string line = s.substr(start, end - start);
        if (!line.empty() && line.back() == '\r')
            line.pop_back();
        lines.push_back(line);
        start = end + 1;
    }
    return lines;
}

bool blank(const std::string &line)
{
    return line.find_first_not_of(" \t") == std::string::npos;
}

/* A traceback line: indented source, "Traceback ...", or a traced frame "path(12): name". */
bool traceback_line(const std::string &line)
{
    if (line.empty() || line[0] == ' ' || line[0] == '\t' || line.rfind("Traceback", 0) == 0)
        return true;
    size_t close = line.find("): ");
    size_t open = line.rfind('(', close);
    if (close == std::string::npos || open == std::string::npos || open == 0)
        return false;
    for (size_t i = open + 1; i < close; i++)
        if (line[i] < '0' || line[i] > '9')
            return false;
    return open + 1 < close && line.find(' ') > open;
}

std::string condense(const std::string &msg)
{
    std::vector<std::string> lines = split_lines(msg);
    std::string out;
    if (msg.find("Traceback of TorchScript") != std::string::npos) {
        /* The interpreter appends the raised error after the tracebacks. */
        size_t first = lines.size();
        while (first > 0 && (blank(lines[first - 1]) || !traceback_line(lines[first - 1])))
            first--;
        for (size_t i = first; i < lines.size(); i++) {
            if (blank(lines[i]))
                continue;
            out += out.empty() ? lines[i] : " " + lines[i];
        }
    }
    for (size_t i = 0; out.empty() && i < lines.size(); i++) {
        if (blank(lines[i]))
            continue;
        out = lines[i];
        /* A TorchScript compile error: "expected ) ... here:" then '  File "x.py", line 2'. */
        size_t file = i + 1 < lines.size() ? lines[i + 1].find("File \"") : std::string::npos;
        if (!out.empty() && out.back() == ':' && file != std::string::npos)
            out += " " + lines[i + 1].substr(file);
    }
    /* TORCH_CHECK's boilerplate says nothing about the failure. */
    size_t boiler = out.find("(Could this error message be improved?");
    if (boiler != std::string::npos) {
        out.erase(boiler);
        while (!out.empty() && out.back() == ' ')
            out.pop_back();
    }
    if (out.size() > MESSAGE_MAX)
        out = out.substr(0, MESSAGE_MAX) + "...";
    return out;
}

} // namespace

std::string message_of(const std::exception &e)
{
    if (dynamic_cast<const Error *>(&e))
        return e.what();
    if (dynamic_cast<const std::bad_alloc *>(&e))
        return "out of memory";
    if (const auto *ce = dynamic_cast<const c10::Error *>(&e))
        return condense(ce->what_without_backtrace());
    return condense(e.what());
}

int code_of(const std::exception &e, int default_code)
{
    if (const auto *ge = dynamic_cast<const Error *>(&e))
        return ge->code;
    if (dynamic_cast<const std::bad_alloc *>(&e) || dynamic_cast<const c10::OutOfMemoryError *>(&e))
        return GR_ENOMEM;
    if (std::string(e.what()).find("not enough memory") != std::string::npos)
        return GR_ENOMEM;
    return default_code;
}

int fail_with(const std::exception &e, int default_code)
{
    try {
        std::string msg = message_of(e);
        return gr__set_error(code_of(e, default_code), msg.c_str());
    } catch (...) {
        return gr__set_error(GR_ENOMEM, "out of memory while reporting an error");
    }
}

int fail_unknown(const char *fn)
{
    return gr__set_errorf(GR_EINTERNAL, "%s: unknown exception", fn);
}

c10::ScalarType to_scalar(int dtype)
{
    switch (dtype) {
    case GR_DTYPE_F32:
        return c10::kFloat;
    case GR_DTYPE_F64:
        return c10::kDouble;
    case GR_DTYPE_F16:
        return c10::kHalf;
    case GR_DTYPE_BF16:
        return c10::kBFloat16;
    case GR_DTYPE_I64:
        return c10::kLong;
    case GR_DTYPE_I32:
        return c10::kInt;
    case GR_DTYPE_I16:
        return c10::kShort;
    case GR_DTYPE_I8:
        return c10::kChar;
    case GR_DTYPE_U8:
        return c10::kByte;
    case GR_DTYPE_BOOL:
        return c10::kBool;
    }
    throw Error(GR_EINVAL, "dtype " + std::to_string(dtype) + " is not a gr_dtype_t");
}

int from_scalar(c10::ScalarType t)
{
    switch (t) {
    case c10::kFloat:
        return GR_DTYPE_F32;
    case c10::kDouble:
        return GR_DTYPE_F64;
    case c10::kHalf:
        return GR_DTYPE_F16;
    case c10::kBFloat16:
        return GR_DTYPE_BF16;
    case c10::kLong:
        return GR_DTYPE_I64;
    case c10::kInt:
        return GR_DTYPE_I32;
    case c10::kShort:
        return GR_DTYPE_I16;
    case c10::kChar:
        return GR_DTYPE_I8;
    case c10::kByte:
        return GR_DTYPE_U8;
    case c10::kBool:
        return GR_DTYPE_BOOL;
    default:
        return GR_DTYPE_INVALID;
    }
}

} // namespace gr

extern "C" int gr_runtime_init(int intra_op_threads)
{
    try {
        if (intra_op_threads < 0)
            return gr__set_errorf(GR_EINVAL, "intra_op_threads %d is negative", intra_op_threads);
        if (intra_op_threads > 0)
            at::set_num_threads(intra_op_threads);
        return GR_OK;
    } catch (const std::exception &e) {
        return gr::fail_with(e, GR_EINTERNAL);
    } catch (...) {
        return gr::fail_unknown("gr_runtime_init");
    }
}

extern "C" const char *gr_runtime_torch_version(void)
{
    return TORCH_VERSION;
}
