/*
 * graph_runtime modules: loading TorchScript archives from memory and the process-wide registry
 * that content-addresses them by SHA-256 with reference counts. The registry is the one piece of
 * shared mutable state in the runtime: device workers load and release concurrently, so a mutex
 * guards it, and each module serialises the clones that captures take of it.
 *
 * TorchScript is the only format today; load_archive() is the one place that knows it.
 */
#include "engine_int.h"

#include <atomic>
#include <cctype>
#include <cstring>
#include <istream>
#include <mutex>
#include <streambuf>
#include <unordered_map>
#include <unordered_set>

#include <c10/util/accumulate.h>
#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/version.h>

struct gr_module {
    std::string key; /* the cache key (gr_module_load_keyed's), then the SHA-256, raw bytes */
    uint8_t sha256[GR_SHA256_LEN];
    uint64_t archive_bytes = 0;
    torch::jit::Module module;
    /* Parameters and buffers the archive holds as one element expanded to a shape (the Python
     * client saves its parameters that way): the module keeps that element alone, as a 0-dim
     * tensor, and this maps it to the shape. Clones materialise them on their device. */
    std::unordered_map<const c10::TensorImpl *, std::vector<int64_t>> expanded;
    uint32_t refcount = 1; /* guarded by the registry mutex */
    std::mutex clone_mu;
};

namespace
{

struct Registry {
    std::mutex mu;
    std::unordered_map<std::string, gr_module *> modules;
};

/* Never destroyed: modules still loaded at exit must not be torn down after libtorch's statics. */
Registry &registry()
{
    static Registry *r = new Registry;
    return *r;
}

/* A read-only, seekable stream buffer over caller memory: the archive is parsed in place. */
class MemoryBuf : public std::streambuf
{
  public:
    MemoryBuf(const void *data, size_t len)
    {
        char *p = static_cast<char *>(const_cast<void *>(data));
        setg(p, p, p + len);
    }

  protected:
    pos_type seekoff(off_type off, std::ios_base::seekdir dir,
                     std::ios_base::openmode which) override
    {
        if (!(which & std::ios_base::in))
            return pos_type(off_type(-1));
        off_type base = dir == std::ios_base::beg   ? 0
                        : dir == std::ios_base::cur ? gptr() - eback()
                                                    : egptr() - eback();
        off_type target = base + off;
        if (target < 0 || target > egptr() - eback())
            return pos_type(off_type(-1));
        setg(eback(), eback() + target, egptr());
        return pos_type(target);
    }

    pos_type seekpos(pos_type pos, std::ios_base::openmode which) override
    {
        return seekoff(off_type(pos), std::ios_base::beg, which);
    }
};

uint32_t le(const uint8_t *p, int n)
{
    uint32_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* What libtorch 1.13's archive reader needs before it is safe to call: it leaks its state when it
 * throws from its constructor (no end-of-central-directory record, a damaged central directory,
 * no version record), and the daemon takes archives from clients. So the ZIP directory is checked
 * here first: "" when it looks like torch.jit.save's, else why not. ZIP64 archives (over 4 GiB)
 * are left to libtorch. */
std::atomic<uint64_t> max_unpacked{UINT64_C(4) << 30}; /* gr_module_max_unpacked */

std::string zip_precheck(const void *bytes, size_t len)
{
    const auto *p = static_cast<const uint8_t *>(bytes);
    const size_t eocd_len = 22, max_comment = 65535, cdh_len = 46;
    const uint8_t *eocd = nullptr;
    if (len >= eocd_len) {
        size_t lowest = len > eocd_len + max_comment ? len - eocd_len - max_comment : 0;
        for (size_t i = len - eocd_len + 1; i-- > lowest;)
            if (le(p + i, 4) == 0x06054b50) {
                eocd = p + i;
                break;
            }
    }
    if (eocd == nullptr)
        return "not a ZIP archive (no end-of-central-directory record: truncated?)";
    uint32_t entries = le(eocd + 10, 2), cd_size = le(eocd + 12, 4), cd_off = le(eocd + 16, 4);
    if (entries == 0xffff || cd_size == 0xffffffff || cd_off == 0xffffffff)
        return "";
    if (uint64_t(cd_off) + cd_size > uint64_t(eocd - p))
        return "damaged ZIP central directory";
    if (entries == 0)
        return "the archive holds no files";
    std::unordered_set<std::string> names;
    std::string first;
    uint64_t unpacked = 0; /* a ZIP64 entry's size (0xffffffff here) counts as 4 GiB */
    size_t off = cd_off, end = size_t(cd_off) + cd_size;
    for (uint32_t e = 0; e < entries; e++) {
        if (off + cdh_len > end || le(p + off, 4) != 0x02014b50)
            return "damaged ZIP central directory";
        size_t name_len = le(p + off + 28, 2), extra = le(p + off + 30, 2);
        size_t comment = le(p + off + 32, 2);
        if (off + cdh_len + name_len + extra + comment > end)
            return "damaged ZIP central directory";
        unpacked += le(p + off + 24, 4);
        std::string name(reinterpret_cast<const char *>(p + off + cdh_len), name_len);
        if (e == 0)
            first = name;
        names.insert(std::move(name));
        off += cdh_len + name_len + extra + comment;
    }
    const uint64_t bound = max_unpacked.load(std::memory_order_relaxed);
    if (bound != 0 && unpacked > bound)
        return "its files would unpack to " + std::to_string(unpacked) +
               " bytes, over the daemon's bound of " + std::to_string(bound) +
               " (max_module_unpacked_bytes)";
    size_t slash = first.find('/');
    if (slash == std::string::npos)
        return "file in archive is not in a subdirectory: " + first.substr(0, 100);
    std::string dir = first.substr(0, slash + 1);
    if (!names.count(dir + ".data/version") && !names.count(dir + "version"))
        return "no version record (not written by torch.jit.save?)";
    return "";
}

/* Why tensor t, loaded from a client's archive, is not a view inside its storage, or "". The
 * archive gives each tensor's size, stride and offset over a storage of its own length, and
 * libtorch's loader does not compare them: a view past its storage reads (and writes) the
 * daemon's heap. PyTorch never makes negative strides, so none is taken. */
std::string view_outside_storage(const at::Tensor &t)
{
    if (!t.defined() || t.is_sparse() || !t.has_storage())
        return "";
    if (t.storage_offset() < 0)
        return "a negative storage offset";
    int64_t last = t.storage_offset(), numel = 1;
    for (int64_t d = 0; d < t.dim(); d++) {
        int64_t size = t.size(d), stride = t.stride(d), span = 0;
        if (size < 0 || stride < 0)
            return "a negative size or stride";
        if (size == 0)
            return "";
        if (__builtin_mul_overflow(size - 1, stride, &span) ||
            __builtin_add_overflow(last, span, &last) ||
            __builtin_mul_overflow(numel, size, &numel))
            return "a view too large to address";
    }
    uint64_t need = 0;
    if (__builtin_mul_overflow(static_cast<uint64_t>(last) + 1, t.element_size(), &need))
        return "a view too large to address";
    if (need > t.storage().nbytes())
        return "a view of " + std::to_string(need) + " bytes over a storage of " +
               std::to_string(t.storage().nbytes());
    return "";
}

/* Calls a module's code may not make, whatever they compute: they reach outside the tensors
 * graphd gives the module. from_file maps any file the daemon can open (and, through
 * /proc/self/fd, other sessions' regions); _reshape_alias and the *_unsafe constructors build
 * views and sparse tensors without checking them against their storage, which reads and writes
 * the daemon's heap (libtorch 1.13's _reshape_alias does no check at all). Ops outside the
 * aten, prim and quantized namespaces (cuda::, profiler::, anything a library registers)
 * change the daemon's process state: none is needed by a model. This is one layer: docs/
 * SECURITY.md says what it does not cover. */
const char *const denied_ops[] = {"from_file", "_reshape_alias", "_nested_view_from_buffer",
                                  "_tensor_unsafe"};
const char *const allowed_namespaces[] = {"aten", "prim", "quantized"};

bool namespace_allowed(const std::string &ns)
{
    for (const char *a : allowed_namespaces)
        if (ns == a)
            return true;
    return false;
}

/* Why an operator (qualified "ns::name") may not run in the daemon, or "". */
std::string op_denied(const std::string &ns, const std::string &name)
{
    if (!namespace_allowed(ns))
        return "it calls " + ns + "::" + name +
               " (only aten, prim and quantized operators run "
               "in graphd)";
    for (const char *d : denied_ops)
        if (name.find(d) != std::string::npos)
            return "it calls " + ns + "::" + name +
                   ", which reaches outside the module's "
                   "tensors (files or memory); graphd refuses it";
    return "";
}

/* The archive's code, read before torch::jit::load runs any of it (__setstate__ methods run
 * while it loads): why a code file names a refused operator, or "". The printed TorchScript names
 * aten ops torch.<name> and others ops.<namespace>.<name>; custom classes are
 * torch.classes.<namespace>.<name>. Tokens may be split by blanks, line joins and comments. */
class MemoryReader : public caffe2::serialize::ReadAdapterInterface
{
  public:
    MemoryReader(const void *data, size_t len) : data_(static_cast<const char *>(data)), len_(len)
    {
    }
    size_t size() const override
    {
        return len_;
    }
    size_t read(uint64_t pos, void *buf, size_t n, const char *what) const override
    {
        (void)what;
        if (pos >= len_)
            return 0;
        n = std::min<size_t>(n, len_ - pos);
        std::memcpy(buf, data_ + pos, n);
        return n;
    }

  private:
    const char *data_;
    size_t len_;
};

/* A small scanner over printed TorchScript: blanks, line joins and comments between tokens. */
struct Scanner {
    const std::string &s;
    size_t i = 0;

    static bool ident_char(char c)
    {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
    }
    void skip_separators()
    {
        while (i < s.size()) {
            if (std::isspace(static_cast<unsigned char>(s[i])) || s[i] == '\\') {
                i++;
            } else if (s[i] == '#') {
                while (i < s.size() && s[i] != '\n')
                    i++;
            } else {
                break;
            }
        }
    }
    bool dot()
    {
        skip_separators();
        if (i < s.size() && s[i] == '.') {
            i++;
            skip_separators();
            return true;
        }
        return false;
    }
    std::string ident()
    {
        size_t start = i;
        while (i < s.size() && ident_char(s[i]))
            i++;
        return s.substr(start, i - start);
    }
};

/* Every "<ns>.<name>" after a word ops or classes in code: the operators (ops.<ns>.<name>) and
 * custom classes (torch.classes.<ns>.<name>) it names. */
std::vector<std::pair<std::string, std::string>> namespaced_uses(const std::string &code)
{
    std::vector<std::pair<std::string, std::string>> uses;
    Scanner sc{code};
    while (sc.i < code.size()) {
        if (!Scanner::ident_char(code[sc.i])) {
            sc.i++;
            continue;
        }
        std::string word = sc.ident();
        if (word != "ops" && word != "classes")
            continue;
        size_t resume = sc.i;
        if (sc.dot()) {
            std::string ns = sc.ident();
            if (!ns.empty() && sc.dot()) {
                std::string name = sc.ident();
                if (!name.empty())
                    uses.emplace_back(ns, name);
            }
        }
        sc.i = std::max(resume, sc.i);
    }
    return uses;
}

std::string code_denied(const void *bytes, size_t len)
{
    caffe2::serialize::PyTorchStreamReader reader(std::make_shared<MemoryReader>(bytes, len));
    for (const std::string &name : reader.getAllRecords()) {
        if (name.rfind("code/", 0) != 0 || name.size() < 3 ||
            name.compare(name.size() - 3, 3, ".py") != 0)
            continue;
        auto record = reader.getRecord(name);
        std::string code(static_cast<const char *>(std::get<0>(record).get()), std::get<1>(record));
        for (const char *d : denied_ops)
            if (code.find(d) != std::string::npos)
                return "its code (" + name + ") names '" + d +
                       "', which reaches outside the "
                       "module's tensors (files or memory); graphd refuses it";
        for (const auto &use : namespaced_uses(code)) {
            std::string why = op_denied(use.first, use.second);
            if (!why.empty())
                return "its code (" + name + ") " + why.substr(3);
        }
    }
    return "";
}

/* Every node of g and of the blocks inside it. */
template <typename F> void each_node(torch::jit::Block *b, const F &f)
{
    for (torch::jit::Node *n : b->nodes()) {
        f(n);
        for (torch::jit::Block *inner : n->blocks())
            each_node(inner, f);
    }
}

/* Every tensor the loaded module holds (parameters, buffers, other attributes, inside lists,
 * tuples and dicts too) and every tensor constant of its code, checked with
 * view_outside_storage before anything reads them; and every operator its code calls, checked
 * with op_denied (code_denied has looked at the source already; this sees what it compiled to).
 * The code is every function of the module's compilation unit: methods of all submodules, the
 * functions they call, __setstate__. */
void check_loaded(const torch::jit::Module &module)
{
    auto check = [](const at::Tensor &t, const std::string &what) {
        std::string why = view_outside_storage(t);
        if (!why.empty())
            throw gr::Error(GR_EINVAL, "not a loadable TorchScript archive: " + what + " has " +
                                           why + " (a damaged or crafted archive)");
    };
    for (const auto &attr : module.named_attributes(true)) {
        attr.value.visit([&](const c10::IValue &v) {
            if (v.isTensor())
                check(v.toTensor(), "tensor '" + attr.name + "'");
            return false; /* visit the values inside containers too */
        });
    }
    for (torch::jit::Function *fn : module._ivalue()->compilation_unit()->get_functions()) {
        auto *gf = dynamic_cast<torch::jit::GraphFunction *>(fn);
        if (gf == nullptr)
            continue;
        const std::string fname = fn->qualname().qualifiedName();
        each_node(gf->graph()->block(), [&](torch::jit::Node *n) {
            if (n->kind() == c10::prim::Constant && n->output()->type()->cast<c10::TensorType>())
                check(torch::jit::toIValue(n->output())->toTensor(),
                      "a tensor constant of '" + fname + "'");
            const c10::Symbol kind = n->kind();
            std::string why = op_denied(kind.ns().toUnqualString(), kind.toUnqualString());
            if (!why.empty())
                throw gr::Error(GR_EINVAL, "module refused: '" + fname + "': " + why);
        });
    }
}

torch::jit::Module load_archive(const void *bytes, size_t len)
{
    std::string why = zip_precheck(bytes, len);
    if (!why.empty())
        throw gr::Error(GR_EINVAL, "not a loadable TorchScript archive: " + why);
    try {
        why = code_denied(bytes, len);
    } catch (const std::exception &e) {
        throw gr::Error(GR_EINVAL, "not a loadable TorchScript archive: " + gr::message_of(e));
    }
    if (!why.empty())
        throw gr::Error(GR_EINVAL, "module refused: " + why);
    MemoryBuf buf(bytes, len);
    std::istream in(&buf);
    torch::jit::Module module;
    try {
        module = torch::jit::load(in, c10::Device(c10::kCPU));
    } catch (const std::exception &e) {
        throw gr::Error(gr::code_of(e, GR_EINVAL),
                        "not a loadable TorchScript archive: " + gr::message_of(e));
    }
    check_loaded(module);
    return module;
}

/* Parameters or buffers without duplicates (tied weights appear once, as module.parameters()). */
template <typename List> std::vector<torch::jit::Named<at::Tensor>> unique_tensors(const List &list)
{
    std::vector<torch::jit::Named<at::Tensor>> out;
    std::unordered_set<const void *> seen;
    for (const auto &item : list)
        if (seen.insert(item.value.unsafeGetTensorImpl()).second)
            out.push_back(item);
    return out;
}

/* Every parameter and buffer of m with its dotted name, tied ones under each of their names. */
std::vector<torch::jit::Named<at::Tensor>> named_tensors(const torch::jit::Module &m)
{
    std::vector<torch::jit::Named<at::Tensor>> out;
    for (const auto &p : m.named_parameters(true))
        out.push_back(p);
    for (const auto &b : m.named_buffers(true))
        out.push_back(b);
    return out;
}

/* Sets the attribute at a dotted path ("layers.3.weight") of root to v. */
void set_by_path(const torch::jit::Module &root, const std::string &path, const at::Tensor &v)
{
    torch::jit::Module mod = root;
    size_t start = 0;
    for (size_t dot; (dot = path.find('.', start)) != std::string::npos; start = dot + 1)
        mod = mod.attr(path.substr(start, dot - start)).toModule();
    mod.setattr(path.substr(start), v);
}

/* One value repeated over a shape: every stride 0 (what torch.expand of one element gives). */
bool is_expanded_scalar(const at::Tensor &t)
{
    if (!t.defined() || t.dim() == 0 || t.numel() <= 1)
        return false;
    for (int64_t s : t.strides())
        if (s != 0)
            return false;
    return true;
}

/* Replaces each expanded parameter and buffer of m->module by its one element. Copying an
 * expanded tensor to a GPU first writes it out in full on the CPU and then moves it (for a
 * (256, 4096, 8) MLP, half a gigabyte written and copied for each capture); the element alone
 * is copied in no time, and module_clone expands it on the device. */
void compact_expanded(gr_module_t *m)
{
    std::unordered_map<const c10::TensorImpl *, at::Tensor> done; /* tied: one compact tensor */
    for (const auto &item : named_tensors(m->module)) {
        const at::Tensor &t = item.value;
        if (!is_expanded_scalar(t))
            continue;
        auto it = done.find(t.unsafeGetTensorImpl());
        if (it == done.end()) {
            at::Tensor one = t.detach().as_strided({}, {}, t.storage_offset()).clone();
            one.requires_grad_(t.requires_grad());
            m->expanded.emplace(one.unsafeGetTensorImpl(), t.sizes().vec());
            it = done.emplace(t.unsafeGetTensorImpl(), one).first;
        }
        set_by_path(m->module, item.name, it->second);
    }
}

/* A deep copy of m (its tensors on the CPU, as loaded) with its tensors on device. libtorch >= 2.1
 * copies each tensor straight to the device; before, the copy is made on the CPU and then moved,
 * which for a CUDA device copies every parameter twice. */
torch::jit::Module copy_to(const torch::jit::Module &m, c10::Device device)
{
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
    if (!device.is_cpu()) /* on the CPU deepcopy(device) would alias, not copy, the tensors */
        return m.deepcopy(device);
#endif
    torch::jit::Module copy = m.deepcopy();
    copy.to(device);
    return copy;
}

} // namespace

namespace gr
{

const std::string &module_key(const gr_module_t *m)
{
    return m->key;
}

torch::jit::Module module_clone(gr_module_t *m, c10::Device device)
{
    std::lock_guard<std::mutex> lock(m->clone_mu);
    /* deepcopy clones tensors; with grad mode on, parameters would come back as non-leaf
     * results of clone(). Copy without grad, then restore requires_grad from the original. */
    c10::NoGradGuard no_grad;
    torch::jit::Module copy = copy_to(m->module, device);
    if (!m->expanded.empty()) {
        /* Each compact tensor, now on the device, expanded to its shape and written out there;
         * the lists of the original and the copy name the same tensors in the same order. */
        auto orig = named_tensors(m->module), mine = named_tensors(copy);
        std::unordered_map<const c10::TensorImpl *, at::Tensor> done; /* tied stay tied */
        for (size_t i = 0; i < orig.size() && i < mine.size(); i++) {
            auto shape = m->expanded.find(orig[i].value.unsafeGetTensorImpl());
            if (shape == m->expanded.end())
                continue;
            const at::Tensor &one = mine[i].value;
            auto it = done.find(one.unsafeGetTensorImpl());
            if (it == done.end())
                it = done.emplace(one.unsafeGetTensorImpl(), one.expand(shape->second).contiguous())
                         .first;
            set_by_path(copy, mine[i].name, it->second);
        }
    }
    auto orig_params = m->module.named_parameters(true);
    auto copy_params = copy.named_parameters(true);
    for (auto o = orig_params.begin(), c = copy_params.begin();
         o != orig_params.end() && c != copy_params.end(); ++o, ++c)
        (*c).value.requires_grad_((*o).value.requires_grad());
    auto orig_bufs = m->module.named_buffers(true);
    auto copy_bufs = copy.named_buffers(true);
    for (auto o = orig_bufs.begin(), c = copy_bufs.begin();
         o != orig_bufs.end() && c != copy_bufs.end(); ++o, ++c)
        if ((*o).value.requires_grad() && (*c).value.is_floating_point())
            (*c).value.requires_grad_(true);
    return copy;
}

} // namespace gr

extern "C" int gr_module_max_unpacked(uint64_t bytes)
{
    max_unpacked.store(bytes, std::memory_order_relaxed);
    return GR_OK;
}

extern "C" int gr_module_load(const void *bytes, size_t len, gr_module_t **out)
{
    return gr_module_load_keyed(bytes, len, 0, out);
}

extern "C" int gr_module_load_keyed(const void *bytes, size_t len, uint64_t scope,
                                    gr_module_t **out)
{
    try {
        if (out == nullptr)
            return gr__set_error(GR_EINVAL, "gr_module_load: NULL out");
        *out = nullptr;
        if (bytes == nullptr || len == 0)
            return gr__set_error(GR_EINVAL, "empty module archive");

        uint8_t sha[GR_SHA256_LEN];
        int rc = gr_sha256(bytes, len, sha);
        if (rc != GR_OK)
            return rc;
        std::string key(reinterpret_cast<const char *>(&scope), sizeof(scope));
        key.append(reinterpret_cast<const char *>(sha), sizeof(sha));
        Registry &reg = registry();
        {
            std::lock_guard<std::mutex> lock(reg.mu);
            auto it = reg.modules.find(key);
            if (it != reg.modules.end()) {
                it->second->refcount++;
                *out = it->second;
                return GR_OK;
            }
        }

        /* Parse outside the lock; if another thread loaded the same bytes meanwhile, use its. */
        auto m = std::make_unique<gr_module>();
        m->module = load_archive(bytes, len);
        compact_expanded(m.get());
        m->key = key;
        std::memcpy(m->sha256, sha, sizeof(sha));
        m->archive_bytes = len;
        std::lock_guard<std::mutex> lock(reg.mu);
        auto it = reg.modules.find(key);
        if (it != reg.modules.end()) {
            it->second->refcount++;
            *out = it->second;
            return GR_OK;
        }
        reg.modules.emplace(key, m.get());
        *out = m.release();
        return GR_OK;
    } catch (const std::exception &e) {
        return gr::fail_with(e, GR_EINVAL);
    } catch (...) {
        return gr::fail_unknown("gr_module_load");
    }
}

extern "C" int gr_module_release(gr_module_t *m)
{
    try {
        if (m == nullptr)
            return gr__set_error(GR_EINVAL, "gr_module_release: NULL module");
        Registry &reg = registry();
        {
            std::lock_guard<std::mutex> lock(reg.mu);
            if (--m->refcount > 0)
                return GR_OK;
            reg.modules.erase(m->key);
        }
        delete m;
        return GR_OK;
    } catch (const std::exception &e) {
        return gr::fail_with(e, GR_EINTERNAL);
    } catch (...) {
        return gr::fail_unknown("gr_module_release");
    }
}

extern "C" int gr_module_sha256(const gr_module_t *m, uint8_t out[GR_SHA256_LEN])
{
    if (m == nullptr || out == nullptr)
        return gr__set_error(GR_EINVAL, "gr_module_sha256: NULL argument");
    std::memcpy(out, m->sha256, GR_SHA256_LEN);
    return GR_OK;
}

extern "C" int gr_module_info(const gr_module_t *m, gr_module_info_t *out)
{
    try {
        if (m == nullptr || out == nullptr)
            return gr__set_error(GR_EINVAL, "gr_module_info: NULL argument");
        gr_module_info_t info{};
        std::memcpy(info.sha256, m->sha256, GR_SHA256_LEN);
        info.archive_bytes = m->archive_bytes;
        info.is_training = m->module.is_training() ? 1 : 0;
        for (const auto &p : unique_tensors(m->module.named_parameters(true))) {
            info.n_parameters++;
            info.n_trainable += p.value.requires_grad() ? 1 : 0;
            auto shape = m->expanded.find(p.value.unsafeGetTensorImpl());
            info.parameter_bytes +=
                shape == m->expanded.end()
                    ? p.value.nbytes()
                    : static_cast<uint64_t>(c10::multiply_integers(shape->second)) *
                          p.value.element_size();
        }
        info.n_buffers =
            static_cast<uint32_t>(unique_tensors(m->module.named_buffers(true)).size());
        {
            std::lock_guard<std::mutex> lock(registry().mu);
            info.refcount = m->refcount;
        }
        *out = info;
        return GR_OK;
    } catch (const std::exception &e) {
        return gr::fail_with(e, GR_EINTERNAL);
    } catch (...) {
        return gr::fail_unknown("gr_module_info");
    }
}

extern "C" int gr_module_has_method(const gr_module_t *m, const char *name)
{
    try {
        if (m == nullptr || name == nullptr)
            return gr__set_error(GR_EINVAL, "gr_module_has_method: NULL argument");
        return m->module.find_method(name).has_value() ? 1 : 0;
    } catch (const std::exception &e) {
        return gr::fail_with(e, GR_EINTERNAL);
    } catch (...) {
        return gr::fail_unknown("gr_module_has_method");
    }
}

extern "C" size_t gr_module_loaded_count(void)
{
    try {
        Registry &reg = registry();
        std::lock_guard<std::mutex> lock(reg.mu);
        return reg.modules.size();
    } catch (...) {
        return 0;
    }
}
