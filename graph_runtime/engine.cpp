/*
 * graph_runtime engine: captures and replays callables with the semantics of
 * torch.cuda.make_graphed_callables (torch/cuda/graphs.py), whatever the device family.
 *
 * Mirrors upstream step by step: buffers must not require grad; the static input surface of a
 * callable is its sample args followed by module.parameters(); num_warmup_iters warm-up
 * iterations run forward and autograd.grad (over the outputs that require grad, w.r.t. the
 * surface entries that require grad, allow_unused = allow_unused_input) per callable; forwards
 * are captured in order and backwards in reverse order in one pool; outputs are flattened as
 * pytree does; a gradient autograd leaves undefined is upstream's None. allow_unused_input and
 * outputs that need no grad follow torch 2.x's graphs.py (the GPU machine's torch; Debian's 1.13
 * copy has neither and asserts that every output requires grad). Where graphd differs:
 * static tensors live in caller blocks (so parameters and buffers are rebound to caller memory:
 * the client sees the running stats each replay updates, as upstream's module does), and the
 * last warm-up iteration learns output shapes and which gradients are absent (without warm-up, a
 * probe iteration does, with buffers restored so it leaves no trace in module state). A
 * callable whose method uses random ops gets its family's generator state as a static tensor
 * (RNG_STATE), so that its random numbers follow the client's generator, not the daemon's.
 */
#include "engine_int.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/jit/ir/alias_analysis.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/runtime/graph_executor.h>

namespace gr
{

/* A graph pool: its device and the family's state for it. */
struct Pool {
    const Family *family;
    int index;
    std::string device_name;
    std::unique_ptr<PoolState> state;
};

} // namespace gr

struct gr_pool {
    std::shared_ptr<gr::Pool> pool;
};

struct gr_capture {
    std::shared_ptr<gr::Pool> pool;
    std::vector<std::unique_ptr<gr::Callable>> callables;
};

struct gr_graph {
    std::shared_ptr<gr::Pool> pool;
    std::unique_ptr<gr::Callable> callable;
    bool forward_pending = false;
    uint64_t forward_replays = 0;
    uint64_t backward_replays = 0;
    uint64_t failed_replays = 0;
};

namespace gr
{

namespace
{

/* The device families graphd knows, one row each: the kind a device name starts with, the
 * family when this build has it (GR_FAMILY_<KIND>, nullptr when not), and what a device of a
 * kind that is not built answers. Adding a family: a family_<kind>.cpp and one row here
 * (docs/ARCHITECTURE.md, "Adding a device family"). */
struct FamilyRow {
    const char *kind;
    const Family &(*family)();
    const char *missing;
};

const FamilyRow FAMILY_TABLE[] = {
    {"cpu", &family_cpu, nullptr},
    {"cuda", GR_FAMILY_CUDA, "this graphd was built without a CUDA libtorch"},
    {"xpu", GR_FAMILY_XPU, "this graphd was built without an XPU libtorch"},
};

} // namespace

DeviceRef parse_device(const char *device)
{
    std::string s(device);
    size_t colon = s.find(':');
    std::string kind = s.substr(0, colon);
    int index = 0;
    if (colon != std::string::npos) {
        std::string num = s.substr(colon + 1);
        if (num.empty() || num.size() > 6 ||
            num.find_first_not_of("0123456789") != std::string::npos)
            throw Error(GR_EINVAL, "malformed device '" + s + "' (expected kind[:index])");
        index = std::stoi(num);
    }
    const FamilyRow *row = nullptr;
    for (const FamilyRow &r : FAMILY_TABLE)
        if (kind == r.kind)
            row = &r;
    if (row == nullptr) {
        std::string known;
        for (const FamilyRow &r : FAMILY_TABLE)
            known += std::string(known.empty() ? "" : ", ") + r.kind;
        throw Error(GR_EINVAL,
                    "unknown device kind '" + kind + "' in '" + s + "' (known: " + known + ")");
    }
    if (row->family == nullptr)
        throw Error(GR_EUNSUPPORTED, "device '" + s + "': " + row->missing);
    const Family *family = &row->family();
    if (index >= family->device_count())
        throw Error(GR_ENOTFOUND, "no device " + s);
    return {family, index, kind + ":" + std::to_string(index)};
}

/* ---- Family defaults: a family without device memory of its own ------------------------- */

std::vector<gr_device_info_t> Family::devices() const
{
    return {};
}

void Family::pool_memory(const PoolState * /*state*/, uint64_t *reserved, uint64_t *in_use) const
{
    *reserved = 0;
    *in_use = 0;
}

void Family::check_sharing(const std::string &device) const
{
    throw Error(GR_EINVAL, "device-resident static tensors need a device with memory of its own, "
                           "not " +
                               device + " (" + kind() + " has no device memory of its own)");
}

int Family::alloc(int /*index*/, const char *device, uint64_t /*bytes*/, void ** /*ptr*/,
                  uint8_t * /*handle*/) const
{
    return gr__set_errorf(GR_EUNSUPPORTED,
                          "gr_device_alloc on %s: %s has no device memory of its own", device,
                          kind());
}

int Family::free(int /*index*/, const char *device, void * /*ptr*/) const
{
    return gr__set_errorf(GR_EUNSUPPORTED,
                          "gr_device_free on %s: %s has no device memory of its own", device,
                          kind());
}

uint64_t Family::reclaim(int /*index*/, bool /*wait*/) const
{
    return 0;
}

int Family::event_create(int /*index*/, const char *device, gr_event_t ** /*out*/,
                         uint8_t * /*handle*/) const
{
    return gr__set_errorf(GR_EUNSUPPORTED, "gr_event_create on %s: %s has no interprocess events",
                          device, kind());
}

int Family::event_open(int /*index*/, const char *device, const uint8_t * /*handle*/,
                       gr_event_t ** /*out*/) const
{
    return gr__set_errorf(GR_EUNSUPPORTED, "gr_event_open on %s: %s has no interprocess events",
                          device, kind());
}

void Family::event_destroy(gr_event_t *e) const
{
    delete e; /* not reached: no event of this family exists */
}

int Family::seq_create(int /*index*/, const char *device, gr_seq_t ** /*out*/,
                       uint8_t * /*handle*/) const
{
    return gr__set_errorf(GR_EUNSUPPORTED,
                          "gr_seq_create on %s: %s has no sequence counters in device memory",
                          device, kind());
}

int Family::seq_skip(gr_seq_t * /*s*/, uint64_t /*n*/) const
{
    return gr__set_errorf(GR_EUNSUPPORTED, "gr_seq_skip: %s has no sequence counters", kind());
}

int Family::seq_release(gr_seq_t * /*s*/) const
{
    return gr__set_errorf(GR_EUNSUPPORTED, "gr_seq_release: %s has no sequence counters", kind());
}

void Family::seq_destroy(gr_seq_t *s) const
{
    delete s; /* not reached: no counters of this family exist */
}

namespace
{

const char *const UPSTREAM_BUFFER_MSG =
    "In any :class:`~torch.nn.Module` passed to :func:`~make_graphed_callables`, only parameters "
    "may be trainable. All buffers must have ``requires_grad=False``.";

const int64_t MAX_BYTES = int64_t(1) << 48; /* bound on one static tensor */

std::shared_ptr<Pool> make_pool(const DeviceRef &d)
{
    auto pool = std::make_shared<Pool>();
    pool->family = d.family;
    pool->index = d.index;
    pool->device_name = d.name;
    pool->state = d.family->make_pool(d.index);
    return pool;
}

std::string shape_str(c10::IntArrayRef shape)
{
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); i++)
        s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

/* Copies of the buffers, written back by restore(): probe and CPU capture runs leave no trace. */
class BufferSnapshot
{
  public:
    explicit BufferSnapshot(const std::vector<at::Tensor> &buffers) : buffers_(buffers)
    {
        c10::NoGradGuard no_grad;
        for (const at::Tensor &b : buffers_)
            saved_.push_back(b.clone());
    }
    void restore()
    {
        c10::NoGradGuard no_grad;
        for (size_t i = 0; i < buffers_.size(); i++)
            buffers_[i].copy_(saved_[i]);
    }

  private:
    std::vector<at::Tensor> buffers_;
    std::vector<at::Tensor> saved_;
};

/* pytree's flatten: tensors depth-first, dict values in insertion order. */
void flatten(const c10::IValue &v, const std::string &path, std::vector<at::Tensor> &out,
             std::vector<std::string> *names)
{
    auto child = [&path](const std::string &key) { return path.empty() ? key : path + "." + key; };
    if (v.isTensor()) {
        out.push_back(v.toTensor());
        if (names)
            names->push_back(path);
    } else if (v.isTuple()) {
        const auto &elems = v.toTupleRef().elements();
        for (size_t i = 0; i < elems.size(); i++)
            flatten(elems[i], child(std::to_string(i)), out, names);
    } else if (v.isList()) {
        c10::List<c10::IValue> list = v.toList();
        for (size_t i = 0; i < list.size(); i++)
            flatten(list.get(i), child(std::to_string(i)), out, names);
    } else if (v.isGenericDict()) {
        for (const auto &kv : v.toGenericDict()) {
            const c10::IValue &k = kv.key();
            std::string key = k.isString() ? k.toStringRef()
                              : k.isInt()  ? std::to_string(k.toInt())
                                           : std::string("?");
            flatten(kv.value(), child(key), out, names);
        }
    } else {
        throw Error(GR_EINVAL, "output '" + path + "' is " + v.tagKind() +
                                   ": outputs must be tensors or tuples, lists or dicts of them");
    }
}

std::vector<at::Tensor> call(Callable &c, std::vector<std::string> *names)
{
    /* TorchScript's profiling executor spends a method's first runs profiling and then
     * optimising it (autodiff subgraphs, fusion), most of a capture's time, for an interpreter
     * speed that a captured graph makes moot (and CPU replays are no slower without it). The
     * setting is per thread, so it is set around every call: warm-up, capture and replay all run
     * the plain plan, whose results are eager PyTorch's. */
    torch::jit::GraphOptimizerEnabledGuard no_optimize(false);
    std::vector<c10::IValue> in(c.args.begin(), c.args.end());
    c10::IValue result = (*c.method)(std::move(in));
    std::vector<at::Tensor> outs;
    flatten(result, "", outs, names);
    for (size_t i = 0; i < outs.size(); i++)
        if (!outs[i].defined())
            throw Error(GR_EINVAL, "output " + std::to_string(i) + " is None");
    return outs;
}

/* One warm-up iteration, as upstream's loop body, that also learns the outputs and which
 * gradients autograd leaves undefined: the last iteration's learning is kept, so it costs no run
 * of its own. */
void warmup_iteration(Callable &c)
{
    std::vector<std::string> names;
    std::vector<at::Tensor> outs = call(c, &names);
    c.outputs.clear();
    c.has_backward = false;
    std::vector<at::Tensor> need, grads_out;
    for (size_t i = 0; i < outs.size(); i++) {
        const at::Tensor &o = outs[i];
        std::string what = "output " + std::to_string(i) + " ('" + names[i] + "')";
        if (from_scalar(o.scalar_type()) == GR_DTYPE_INVALID)
            throw Error(GR_EUNSUPPORTED,
                        what + " has dtype " + c10::toString(o.scalar_type()) + ", not supported");
        if (o.dim() > GR_MAX_DIMS)
            throw Error(GR_EUNSUPPORTED, what + " has " + std::to_string(o.dim()) +
                                             " dimensions, more than " +
                                             std::to_string(GR_MAX_DIMS));
        c.outputs.push_back({names[i], o.scalar_type(), o.sizes().vec(), o.requires_grad()});
        if (o.requires_grad()) {
            c.has_backward = true;
            need.push_back(o);
            grads_out.push_back(at::zeros_like(o));
        }
    }
    c.grad_absent.assign(c.grad_targets.size(), false);
    if (!need.empty()) {
        auto grads =
            torch::autograd::grad(need, c.grad_targets, grads_out, false, false, c.allow_unused);
        for (size_t i = 0; i < grads.size() && i < c.grad_absent.size(); i++)
            c.grad_absent[i] = !grads[i].defined();
    }
}

/* What warm-up learns, for a capture without warm-up: leaves buffers as found. */
void probe(Callable &c)
{
    BufferSnapshot snap(c.buffers);
    warmup_iteration(c);
    snap.restore();
}

void add_static(Callable &c, int role, size_t index, const std::string &name, c10::ScalarType st,
                c10::IntArrayRef shape, uint32_t flags)
{
    gr_tensor_desc_t d{};
    d.role = role;
    d.index = static_cast<uint32_t>(index);
    c.names.push_back(name);
    d.name = c.names.back().c_str();
    d.dtype = from_scalar(st);
    d.ndim = static_cast<uint32_t>(shape.size());
    int64_t numel = 1;
    for (size_t k = shape.size(); k-- > 0;) {
        d.shape[k] = shape[k];
        d.strides[k] = numel;
        numel *= shape[k];
    }
    d.nbytes = static_cast<uint64_t>(numel) * gr_dtype_size(d.dtype);
    d.flags = flags;
    if ((flags & GR_TENSOR_EXTERNAL) == 0) {
        c.total_bytes = (c.total_bytes + GR_ALIGN - 1) / GR_ALIGN * GR_ALIGN;
        d.offset = c.total_bytes;
        c.total_bytes += d.nbytes;
    }
    c.layout.push_back(d);
}

/* Block order: inputs, outputs, grad-outputs, grad-inputs, parameters, parameter grads,
 * buffers, the generator state. */
void build_layout(Callable &c)
{
    c.layout.clear();
    c.names.clear();
    c.total_bytes = 0;
    for (size_t i = 0; i < c.args.size(); i++)
        add_static(c, GR_ROLE_INPUT, i, std::to_string(i), c.args[i].scalar_type(),
                   c.args[i].sizes(), c.args[i].requires_grad() ? GR_TENSOR_REQUIRES_GRAD : 0);
    for (size_t i = 0; i < c.outputs.size(); i++)
        add_static(c, GR_ROLE_OUTPUT, i, c.outputs[i].name, c.outputs[i].dtype, c.outputs[i].shape,
                   c.outputs[i].requires_grad ? GR_TENSOR_REQUIRES_GRAD : 0);
    for (size_t i = 0; i < c.outputs.size(); i++)
        if (c.outputs[i].requires_grad)
            add_static(c, GR_ROLE_GRAD_OUTPUT, i, c.outputs[i].name, c.outputs[i].dtype,
                       c.outputs[i].shape, 0);
    size_t target = 0;
    for (size_t i = 0; i < c.args.size(); i++)
        if (c.args[i].requires_grad()) {
            add_static(c, GR_ROLE_GRAD_INPUT, i, std::to_string(i), c.args[i].scalar_type(),
                       c.args[i].sizes(), c.grad_absent[target] ? GR_TENSOR_ABSENT : 0);
            target++;
        }
    for (size_t i = 0; i < c.params.size(); i++)
        add_static(c, GR_ROLE_PARAM, i, c.param_names[i], c.params[i].scalar_type(),
                   c.params[i].sizes(), c.params[i].requires_grad() ? GR_TENSOR_REQUIRES_GRAD : 0);
    const uint32_t external = c.external_param_grads ? GR_TENSOR_EXTERNAL : 0;
    for (size_t i = 0; i < c.params.size(); i++)
        if (c.params[i].requires_grad()) {
            add_static(c, GR_ROLE_PARAM_GRAD, i, c.param_names[i], c.params[i].scalar_type(),
                       c.params[i].sizes(),
                       (c.grad_absent[target] ? GR_TENSOR_ABSENT : 0) | external);
            target++;
        }
    for (size_t i = 0; i < c.n_static_buffers; i++)
        add_static(c, GR_ROLE_BUFFER, i, c.buffer_names[i], c.buffers[i].scalar_type(),
                   c.buffers[i].sizes(), 0);
    if (c.rng)
        add_static(c, GR_ROLE_RNG_STATE, 0, c.rng->name, c.rng->dtype, c.rng->shape, 0);
    c.total_bytes = (c.total_bytes + GR_ALIGN - 1) / GR_ALIGN * GR_ALIGN;
}

/* Calls fn(node) for every node of block and of the blocks nested in it. */
template <typename F> void each_node(torch::jit::Block *block, F &&fn)
{
    for (torch::jit::Node *n : block->nodes()) {
        fn(n);
        for (torch::jit::Block *sub : n->blocks())
            each_node(sub, fn);
    }
}

/* The value v of graph g (a method's: input 0 is self) holds, when it is self or a chain of
 * attribute reads from self; nullopt otherwise. */
std::optional<c10::IValue> attr_value(torch::jit::Value *v, const torch::jit::Graph &g,
                                      const c10::IValue &self)
{
    if (!g.inputs().empty() && v == g.inputs()[0])
        return self;
    const torch::jit::Node *n = v->node();
    if (n->kind() != c10::prim::GetAttr)
        return std::nullopt;
    std::optional<c10::IValue> owner = attr_value(n->input(0), g, self);
    if (!owner || !owner->isObject())
        return std::nullopt;
    const c10::ivalue::Object &obj = owner->toObjectRef();
    const std::string &name = n->s(c10::attr::name);
    if (!obj.type()->hasAttribute(name))
        return std::nullopt;
    return obj.getAttr(name);
}

/* Whether the method draws random numbers: some node of its graph, every call inlined, is
 * nondeterministic (Node::isNondeterministic: dropout, rand_like, bernoulli, normal, ...).
 * Reads of a module's `training` flag are folded to their values first, unless the method sets
 * one: a scripted dropout's train argument is self.training, which isNondeterministic cannot see
 * through, and graphd never switches a captured module's mode. */
bool uses_random_ops(const torch::jit::Module &module, const torch::jit::Method &method)
{
    std::shared_ptr<torch::jit::Graph> g = method.graph()->copy();
    torch::jit::Inline(*g);
    bool sets_training = false;
    std::vector<torch::jit::Node *> training_reads;
    each_node(g->block(), [&](torch::jit::Node *n) {
        if (n->kind() == c10::prim::SetAttr && n->s(c10::attr::name) == "training")
            sets_training = true;
        else if (n->kind() == c10::prim::GetAttr && n->s(c10::attr::name) == "training")
            training_reads.push_back(n);
    });
    if (!sets_training) {
        const c10::IValue self(module._ivalue());
        for (torch::jit::Node *n : training_reads) {
            std::optional<c10::IValue> v = attr_value(n->output(), *g, self);
            if (!v || !v->isBool())
                continue;
            torch::jit::WithInsertPoint at(n);
            n->output()->replaceAllUsesWith(g->insertConstant(v->toBool()));
        }
    }
    bool random = false;
    each_node(g->block(), [&](torch::jit::Node *n) { random = random || n->isNondeterministic(); });
    return random;
}

/* ---- reused warm-ups (gr_capture_prepare, runtime.h) -------------------------------------- */

/* Whether the method (inlined) is straight-line code that writes nothing from outside it: no
 * branch or loop (a scripted method's values could pick its path), no attribute set, and no
 * write to its args or the module's parameters, buffers or other attributes (alias analysis, so
 * an in-place op on a value the method made itself, such as ReLU(inplace=True) on a layer's
 * output, does not count). A torch.jit.trace'd module is straight-line by construction. */
bool straight_and_pure(const torch::jit::Method &method)
{
    std::shared_ptr<torch::jit::Graph> g = method.graph()->copy();
    torch::jit::Inline(*g);
    torch::jit::AliasDb db(g);
    torch::jit::ValueSet outside(g->inputs().begin(), g->inputs().end());
    each_node(g->block(), [&](torch::jit::Node *n) {
        if (n->kind() == c10::prim::GetAttr)
            outside.insert(n->output());
    });
    bool pure = true;
    each_node(g->block(), [&](torch::jit::Node *n) {
        pure = pure && n->kind() != c10::prim::If && n->kind() != c10::prim::Loop &&
               n->kind() != c10::prim::SetAttr && !db.writesToAlias(n, outside);
    });
    return pure;
}

/* What one warm-up learned, and whether a warm-up of the same key can be skipped. */
struct Learned {
    bool skippable = false;
    std::vector<OutputMeta> outputs;
    bool has_backward = false;
    std::vector<bool> grad_absent;
};

/* Everything a callable's warm-up depends on, but the values of its args and parameters: the
 * module (its archive's SHA-256 and the scope it was loaded under), method, device, options and
 * sample specs. */
std::string warmup_key(const gr_callable_spec_t &spec, const Callable &c,
                       const gr_capture_opts_t &o)
{
    std::string k = module_key(spec.module);
    k += '\0';
    k += c.method_name;
    k += '\0';
    k += c.device.str();
    auto put = [&k](int64_t v) { k.append(reinterpret_cast<const char *>(&v), sizeof v); };
    put(c.allow_unused);
    put(o.resident);
    put(c.external_param_grads);
    put(static_cast<int64_t>(spec.n_args));
    for (size_t j = 0; j < spec.n_args; j++) {
        const gr_arg_spec_t &a = spec.args[j];
        put(a.dtype);
        put(a.requires_grad != 0);
        put(a.ndim);
        for (uint32_t d = 0; d < a.ndim; d++)
            put(a.shape[d]);
    }
    return k;
}

/* A warm-up could change nothing the capture starts from, and the values it ran on could not
 * change what it learned or set up: no random draws, no buffers to update, straight-line code
 * that writes nothing outside the method, and no arg whose values could pick what runs
 * (indices). */
bool warmup_skippable(const gr_callable_spec_t &spec, const Callable &c)
{
    if (c.random || !c.buffers.empty())
        return false;
    for (size_t j = 0; j < spec.n_args; j++)
        if (!gr_dtype_is_floating(spec.args[j].dtype))
            return false;
    return straight_and_pure(*c.method);
}

/* The process's warm-ups, by warmup_key: the last kWarmupMemo keys. */
class WarmupMemo
{
  public:
    std::optional<Learned> find(const std::string &key)
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = map_.find(key);
        if (it == map_.end())
            return std::nullopt;
        return it->second;
    }
    void store(const std::string &key, Learned learned)
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto [it, fresh] = map_.insert_or_assign(key, std::move(learned));
        (void)it;
        if (!fresh)
            return;
        order_.push_back(key);
        if (order_.size() > kWarmupMemo) {
            map_.erase(order_.front());
            order_.pop_front();
        }
    }

  private:
    static constexpr size_t kWarmupMemo = 1024;
    std::mutex mu_;
    std::unordered_map<std::string, Learned> map_;
    std::deque<std::string> order_;
};

WarmupMemo &warmup_memo()
{
    static WarmupMemo *memo = new WarmupMemo; /* never destroyed: captures may run at exit */
    return *memo;
}

Learned learned_of(const Callable &c, bool skippable)
{
    return Learned{skippable, c.outputs, c.has_backward, c.grad_absent};
}

void apply(Callable &c, const Learned &l)
{
    c.outputs = l.outputs;
    c.has_backward = l.has_backward;
    c.grad_absent = l.grad_absent;
    c.warmup_reused = true;
}

at::Tensor make_sample(const gr_arg_spec_t &a, c10::Device device)
{
    std::vector<int64_t> shape(a.shape, a.shape + a.ndim);
    c10::ScalarType st = to_scalar(a.dtype);
    at::Tensor t;
    if (a.data != nullptr) {
        t = torch::from_blob(const_cast<void *>(a.data), shape, at::TensorOptions().dtype(st))
                .to(device, st, false, true);
    } else if (gr_dtype_is_floating(a.dtype)) {
        std::lock_guard<std::mutex> lock(cpu_generator_mutex());
        t = torch::randn(shape, at::TensorOptions().dtype(at::kFloat)).to(device, st);
    } else {
        t = torch::zeros(shape, at::TensorOptions().dtype(st).device(device));
    }
    return t.requires_grad_(a.requires_grad != 0);
}

void check_arg(const gr_arg_spec_t &a, size_t j)
{
    std::string what = "arg " + std::to_string(j);
    if (gr_dtype_size(a.dtype) == 0)
        throw Error(GR_EINVAL, what + ": dtype " + std::to_string(a.dtype) + " is not supported");
    if (a.ndim > GR_MAX_DIMS)
        throw Error(GR_EINVAL, what + ": " + std::to_string(a.ndim) + " dimensions, more than " +
                                   std::to_string(GR_MAX_DIMS));
    int64_t bytes = static_cast<int64_t>(gr_dtype_size(a.dtype));
    for (uint32_t k = 0; k < a.ndim; k++) {
        if (a.shape[k] < 0)
            throw Error(GR_EINVAL, what + ": negative dimension " + std::to_string(a.shape[k]));
        if (a.shape[k] > 0 && bytes > MAX_BYTES / a.shape[k])
            throw Error(GR_EINVAL, what + ": too large");
        bytes *= a.shape[k];
    }
    if (a.requires_grad && !gr_dtype_is_floating(a.dtype))
        throw Error(GR_EINVAL, what + ": only floating-point tensors can require grad, not " +
                                   gr_dtype_name(a.dtype));
}

std::unique_ptr<Callable> prepare_callable(const gr_callable_spec_t &spec, const Pool &pool,
                                           bool allow_unused)
{
    if (spec.module == nullptr)
        throw Error(GR_EINVAL, "NULL module");
    if (spec.n_args > 0 && spec.args == nullptr)
        throw Error(GR_EINVAL, "NULL args");
    for (size_t j = 0; j < spec.n_args; j++)
        check_arg(spec.args[j], j);

    auto c = std::make_unique<Callable>();
    c->device = pool.family->device(pool.index);
    c->allow_unused = allow_unused;
    c->method_name = spec.method ? spec.method : "forward";
    c->module = module_clone(spec.module, c->device);
    auto method = c->module.find_method(c->method_name);
    if (!method)
        throw Error(GR_EINVAL, "module has no method '" + c->method_name + "'");
    c->method.emplace(*method);
    c->is_training = c->module.is_training();
    c->random = uses_random_ops(c->module, *c->method);
    if (c->random)
        c->rng = pool.family->rng_state();

    std::unordered_set<const void *> seen;
    std::vector<at::Tensor> others; /* buffers no static tensor can carry: private */
    for (const auto &b : c->module.named_buffers(true)) {
        if (!seen.insert(b.value.unsafeGetTensorImpl()).second)
            continue;
        if (b.value.requires_grad())
            throw Error(GR_EINVAL,
                        std::string(UPSTREAM_BUFFER_MSG) + " (buffer '" + b.name + "' does)");
        if (from_scalar(b.value.scalar_type()) == GR_DTYPE_INVALID || b.value.dim() > GR_MAX_DIMS) {
            others.push_back(b.value);
            continue;
        }
        c->buffer_names.push_back(b.name);
        c->buffers.push_back(b.value);
    }
    c->n_static_buffers = c->buffers.size();
    c->buffers.insert(c->buffers.end(), others.begin(), others.end());
    seen.clear();
    for (const auto &p : c->module.named_parameters(true)) {
        if (!seen.insert(p.value.unsafeGetTensorImpl()).second)
            continue;
        c->param_names.push_back(p.name);
        c->params.push_back(p.value);
    }
    for (size_t j = 0; j < spec.n_args; j++)
        c->args.push_back(make_sample(spec.args[j], c->device));
    for (const at::Tensor &a : c->args)
        if (a.requires_grad())
            c->grad_targets.push_back(a);
    for (const at::Tensor &p : c->params)
        if (p.requires_grad())
            c->grad_targets.push_back(p);
    return c;
}

/* Makes the static tensors views of base (or, for a host-staged family, device twins of those
 * views) and rebinds the parameters and buffers to theirs. */
void bind(Callable &c, const Family &family, void *base)
{
    c10::NoGradGuard no_grad;
    const bool staged = family.staged() && !c.resident;
    const c10::Device block_device = staged ? c10::Device(c10::kCPU) : c.device;
    auto bytes = static_cast<uint8_t *>(base);
    torch::from_blob(base, {static_cast<int64_t>(c.total_bytes)},
                     at::TensorOptions().dtype(at::kByte).device(block_device))
        .zero_();
    std::vector<at::Tensor> inputs, params, grad_in, grad_param;
    c.out_views.clear();
    c.grad_out_views.clear();
    c.host_views.clear();
    c.dev_views.clear();
    c.external_slots.clear();
    c.rng_state = at::Tensor();
    c.block = bytes;
    for (size_t k = 0; k < c.layout.size(); k++) {
        const gr_tensor_desc_t &d = c.layout[k];
        if (d.flags & GR_TENSOR_EXTERNAL) { /* memory from the backward capture */
            c.external_slots.emplace_back(k, grad_param.size());
            c.host_views.emplace_back();
            c.dev_views.emplace_back();
            grad_param.emplace_back();
            continue;
        }
        auto opts = at::TensorOptions().dtype(to_scalar(d.dtype));
        at::Tensor host =
            torch::from_blob(bytes + d.offset, c10::IntArrayRef(d.shape, d.ndim),
                             c10::IntArrayRef(d.strides, d.ndim), opts.device(block_device));
        at::Tensor v =
            staged ? at::zeros(c10::IntArrayRef(d.shape, d.ndim), opts.device(c.device)) : host;
        c.host_views.push_back(host);
        c.dev_views.push_back(v);
        switch (d.role) {
        case GR_ROLE_INPUT:
            v.copy_(c.args[d.index]);
            v.requires_grad_((d.flags & GR_TENSOR_REQUIRES_GRAD) != 0);
            inputs.push_back(v);
            break;
        case GR_ROLE_OUTPUT:
            c.out_views.push_back(v);
            break;
        case GR_ROLE_GRAD_OUTPUT:
            c.grad_out_views.push_back(v);
            break;
        case GR_ROLE_GRAD_INPUT:
            grad_in.push_back(v);
            break;
        case GR_ROLE_PARAM:
            v.copy_(c.params[d.index]);
            c.params[d.index].set_data(v);
            break;
        case GR_ROLE_PARAM_GRAD:
            grad_param.push_back(v);
            break;
        case GR_ROLE_BUFFER: /* as a parameter: the module now updates the static tensor */
            v.copy_(c.buffers[d.index]);
            c.buffers[d.index].set_data(v);
            break;
        case GR_ROLE_RNG_STATE: /* the family fills it (Family::bind) */
            c.rng_state = v;
            break;
        }
    }
    c.args = inputs;
    c.grad_targets.clear();
    for (const at::Tensor &a : c.args)
        if (a.requires_grad())
            c.grad_targets.push_back(a);
    for (const at::Tensor &p : c.params)
        if (p.requires_grad())
            c.grad_targets.push_back(p);
    for (auto &slot : c.external_slots)
        slot.second += grad_in.size(); /* an index into grad_views */
    c.grad_views = grad_in;
    c.grad_views.insert(c.grad_views.end(), grad_param.begin(), grad_param.end());
    if (c.grad_views.size() != c.grad_targets.size())
        throw Error(GR_EINTERNAL, "static gradients do not match the grad targets");
    if (staged) /* the block starts with the sample args, parameter and buffer values, else 0 */
        for (size_t k = 0; k < c.layout.size(); k++)
            c.host_views[k].copy_(c.dev_views[k].to(c10::kCPU)); /* block may be part-pinned */
    family.bind(c, base, c.total_bytes);
}

void fill_info(const Callable &c, const Pool &pool, gr_graph_info_t *out)
{
    gr_graph_info_t info{};
    std::snprintf(info.device, sizeof(info.device), "%s", pool.device_name.c_str());
    info.is_training = c.is_training ? 1 : 0;
    info.has_backward = c.has_backward ? 1 : 0;
    info.warmup_reused = c.warmup_reused ? 1 : 0;
    for (const gr_tensor_desc_t &d : c.layout)
        info.counts[d.role]++;
    info.total_bytes = c.total_bytes;
    *out = info;
}

void copy_layout(const Callable &c, size_t *count, gr_tensor_desc_t *items, uint64_t *total_bytes)
{
    copy_out(c.layout, count, items);
    if (total_bytes != nullptr)
        *total_bytes = c.total_bytes;
}

} // namespace

void run_forward(Callable &c)
{
    c.live.clear();
    std::vector<at::Tensor> outs = call(c, nullptr);
    if (outs.size() != c.outputs.size())
        throw Error(GR_EINTERNAL, "returned " + std::to_string(outs.size()) +
                                      " tensors, capture saw " + std::to_string(c.outputs.size()));
    std::vector<at::Tensor> live;
    for (size_t i = 0; i < outs.size(); i++) {
        const OutputMeta &m = c.outputs[i];
        if (outs[i].scalar_type() != m.dtype || outs[i].sizes() != c10::IntArrayRef(m.shape))
            throw Error(GR_EINTERNAL, "output " + std::to_string(i) + " is " +
                                          c10::toString(outs[i].scalar_type()) +
                                          shape_str(outs[i].sizes()) + ", capture saw " +
                                          c10::toString(m.dtype) + shape_str(m.shape));
        if (m.requires_grad != outs[i].requires_grad())
            throw Error(GR_EINTERNAL,
                        "output " + std::to_string(i) + " changed requires_grad since capture");
        if (m.requires_grad)
            live.push_back(outs[i]);
    }
    {
        c10::NoGradGuard no_grad;
        for (size_t i = 0; i < outs.size(); i++)
            c.out_views[i].copy_(outs[i]);
    }
    c.live = std::move(live);
}

namespace
{

bool overlaps(const void *a, uint64_t alen, const void *b, uint64_t blen)
{
    auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
    return pa < pb + blen && pb < pa + alen;
}

/* The memory of external PARAM_GRAD k (grad_views[i]), at its backward capture: grads[i] itself
 * where the client may alias it (a dense tensor of the static tensor's dtype and shape on the
 * callable's device, outside the static block and apart from the other adopted gradients), else a
 * tensor of its own that the replays fill. Allocations here come from the graph mempool. */
at::Tensor adopt_gradient(const Callable &c, size_t k, const std::vector<at::Tensor> &grads,
                          size_t i)
{
    const gr_tensor_desc_t &d = c.layout[k];
    const c10::IntArrayRef shape(d.shape, d.ndim);
    const at::Tensor g = i < grads.size() ? grads[i] : at::Tensor();
    if (g.defined() && g.device() == c.device && g.scalar_type() == to_scalar(d.dtype) &&
        g.sizes() == shape && g.is_contiguous() && g.nbytes() == d.nbytes && d.nbytes > 0) {
        bool apart = !overlaps(g.data_ptr(), d.nbytes, c.block, c.total_bytes);
        for (const auto &slot : c.external_slots) {
            const at::Tensor &other = c.grad_views[slot.second];
            if (apart && other.defined() && other.nbytes() > 0)
                apart = !overlaps(g.data_ptr(), d.nbytes, other.data_ptr(), other.nbytes());
        }
        if (apart)
            return g;
    }
    /* Zeroed now; run_backward's loop copies the gradient in (or zeroes it) inside the graph. */
    return at::zeros(shape, at::TensorOptions().dtype(to_scalar(d.dtype)).device(c.device));
}

} // namespace

void run_backward(Callable &c)
{
    std::vector<at::Tensor> live = std::move(c.live);
    c.live.clear();
    auto grads =
        torch::autograd::grad(live, c.grad_targets, c.grad_out_views, false, false, c.allow_unused);
    c10::NoGradGuard no_grad;
    for (const auto &slot : c.external_slots)
        if (!c.grad_views[slot.second].defined())
            c.grad_views[slot.second] = adopt_gradient(c, slot.first, grads, slot.second);
    for (size_t i = 0; i < c.grad_views.size(); i++) {
        if (c.grad_views[i].is_same(i < grads.size() ? grads[i] : at::Tensor()))
            continue; /* adopted: autograd wrote it in place */
        if (i < grads.size() && grads[i].defined())
            c.grad_views[i].copy_(grads[i]);
        else
            c.grad_views[i].zero_();
    }
}

} // namespace gr

using gr::Error;

extern "C" int gr_pool_create(const char *device, gr_pool_t **out)
{
    try {
        if (out == nullptr || device == nullptr)
            return gr__set_error(GR_EINVAL, "gr_pool_create: NULL argument");
        *out = nullptr;
        auto p = std::make_unique<gr_pool>();
        p->pool = gr::make_pool(gr::parse_device(device));
        *out = p.release();
        return GR_OK;
    } catch (const std::exception &e) {
        return gr::fail_with(e, GR_EINTERNAL);
    } catch (...) {
        return gr::fail_unknown("gr_pool_create");
    }
}

extern "C" int gr_pool_destroy(gr_pool_t *p)
{
    try {
        if (p == nullptr)
            return gr__set_error(GR_EINVAL, "gr_pool_destroy: NULL pool");
        if (p->pool.use_count() > 1)
            return gr__set_errorf(GR_EBUSY, "pool on %s is used by %ld captures or graphs",
                                  p->pool->device_name.c_str(), p->pool.use_count() - 1);
        delete p;
        return GR_OK;
    } catch (const std::exception &e) {
        return gr::fail_with(e, GR_EINTERNAL);
    } catch (...) {
        return gr::fail_unknown("gr_pool_destroy");
    }
}

extern "C" int gr_pool_memory(const gr_pool_t *p, uint64_t *reserved, uint64_t *in_use)
{
    try {
        if (p == nullptr || reserved == nullptr || in_use == nullptr)
            return gr__set_error(GR_EINVAL, "gr_pool_memory: NULL argument");
        *reserved = 0;
        *in_use = 0;
        p->pool->family->pool_memory(p->pool->state.get(), reserved, in_use);
        return GR_OK;
    } catch (const std::exception &e) {
        return gr::fail_with(e, GR_EINTERNAL);
    } catch (...) {
        return gr::fail_unknown("gr_pool_memory");
    }
}

extern "C" int gr_capture_prepare(const char *device, size_t n, const gr_callable_spec_t *specs,
                                  const gr_capture_opts_t *opts, gr_capture_t **out)
{
    try {
        if (out == nullptr)
            return gr__set_error(GR_EINVAL, "gr_capture_prepare: NULL out");
        *out = nullptr;
        if (device == nullptr || specs == nullptr || n == 0)
            return gr__set_error(GR_EINVAL, "gr_capture_prepare: no device or no callables");
        gr_capture_opts_t o;
        gr_capture_opts_init(&o);
        if (opts != nullptr)
            o = *opts;
        if (o.num_warmup_iters < 0)
            o.num_warmup_iters = 3;

        gr::CallMemoryBound bound;
        auto cap = std::make_unique<gr_capture>();
        gr::DeviceRef dev = gr::parse_device(device);
        if (o.pool != nullptr) {
            if (o.pool->pool->device_name != dev.name)
                throw Error(GR_EINVAL,
                            "pool is on " + o.pool->pool->device_name + ", not " + dev.name);
            cap->pool = o.pool->pool;
        } else {
            cap->pool = gr::make_pool(dev);
        }
        const gr::Pool &pool = *cap->pool;
        if (o.resident)
            pool.family->check_sharing(pool.device_name);

        c10::AutoGradMode grad_mode(true);
        for (size_t i = 0; i < n; i++) {
            cap->callables.push_back(
                gr::in_context("callable " + std::to_string(i), GR_EINVAL, [&] {
                    return gr::prepare_callable(specs[i], pool, o.allow_unused_input != 0);
                }));
            cap->callables.back()->resident = o.resident != 0;
            cap->callables.back()->external_param_grads =
                o.resident != 0 && o.copy_param_grads == 0;
        }
        bool random = false;
        for (const auto &cl : cap->callables)
            random = random || cl->random;
        /* Reused warm-ups (runtime.h): a callable whose key is known, and skippable, is not run;
         * the family's warm-up still orders the module copies before the capture. */
        std::vector<std::string> keys(o.reuse_warmup ? n : 0);
        std::vector<std::optional<gr::Learned>> known(n);
        for (size_t i = 0; i < keys.size(); i++) {
            keys[i] = gr::warmup_key(specs[i], *cap->callables[i], o);
            known[i] = gr::warmup_memo().find(keys[i]);
        }
        auto reused = [&](size_t i) { return known[i] && known[i]->skippable; };
        pool.family->warmup(pool.index, random, [&] {
            for (size_t i = 0; i < n; i++)
                gr::in_context("callable " + std::to_string(i) + " warm-up", GR_EINVAL, [&] {
                    for (int it = 0; !reused(i) && it < o.num_warmup_iters; it++)
                        gr::warmup_iteration(*cap->callables[i]);
                });
        });
        for (size_t i = 0; i < n; i++)
            gr::in_context("callable " + std::to_string(i), GR_EINVAL, [&] {
                gr::Callable &cl = *cap->callables[i];
                if (reused(i)) {
                    gr::apply(cl, *known[i]);
                } else {
                    if (o.num_warmup_iters == 0)
                        gr::probe(cl);
                    /* A key seen before was judged not skippable (else it was reused). */
                    if (!keys.empty())
                        gr::warmup_memo().store(
                            keys[i],
                            gr::learned_of(cl, !known[i] && gr::warmup_skippable(specs[i], cl)));
                }
                gr::build_layout(cl);
            });
        *out = cap.release();
        return GR_OK;
    } catch (const std::exception &e) {
        return gr::fail_with(e, GR_EINVAL);
    } catch (...) {
        return gr::fail_unknown("gr_capture_prepare");
    }
}

extern "C" int gr_capture_layout(const gr_capture_t *c, size_t i, size_t *count,
                                 gr_tensor_desc_t *items, uint64_t *total_bytes)
{
    try {
        if (c == nullptr || count == nullptr)
            return gr__set_error(GR_EINVAL, "gr_capture_layout: NULL argument");
        if (i >= c->callables.size())
            return gr__set_errorf(GR_EINVAL, "gr_capture_layout: callable %zu of %zu", i,
                                  c->callables.size());
        gr::copy_layout(*c->callables[i], count, items, total_bytes);
        return GR_OK;
    } catch (const std::exception &e) {
        return gr::fail_with(e, GR_EINTERNAL);
    } catch (...) {
        return gr::fail_unknown("gr_capture_layout");
    }
}

extern "C" int gr_capture_info(const gr_capture_t *c, size_t i, gr_graph_info_t *out)
{
    try {
        if (c == nullptr || out == nullptr)
            return gr__set_error(GR_EINVAL, "gr_capture_info: NULL argument");
        if (i >= c->callables.size())
            return gr__set_errorf(GR_EINVAL, "gr_capture_info: callable %zu of %zu", i,
                                  c->callables.size());
        gr::fill_info(*c->callables[i], *c->pool, out);
        return GR_OK;
    } catch (const std::exception &e) {
        return gr::fail_with(e, GR_EINTERNAL);
    } catch (...) {
        return gr::fail_unknown("gr_capture_info");
    }
}

extern "C" int gr_capture_finish(gr_capture_t *c, void *const *bases, gr_graph_t **graphs)
{
    std::unique_ptr<gr_capture> cap(c); /* consumed, whatever happens */
    try {
        if (!cap || bases == nullptr || graphs == nullptr)
            return gr__set_error(GR_EINVAL, "gr_capture_finish: NULL argument");
        size_t n = cap->callables.size();
        std::fill(graphs, graphs + n, nullptr);
        for (size_t i = 0; i < n; i++) {
            if (bases[i] == nullptr || reinterpret_cast<uintptr_t>(bases[i]) % GR_ALIGN != 0)
                return gr__set_errorf(GR_EINVAL, "callable %zu: static block %p is not %d-aligned",
                                      i, bases[i], GR_ALIGN);
        }
        const gr::Pool &pool = *cap->pool;
        gr::CallMemoryBound bound;
        c10::AutoGradMode grad_mode(true);
        std::vector<at::Tensor> all_buffers;
        for (size_t i = 0; i < n; i++) {
            gr::Callable &cl = *cap->callables[i];
            gr::in_context("callable " + std::to_string(i), GR_EINVAL,
                           [&] { gr::bind(cl, *pool.family, bases[i]); });
            all_buffers.insert(all_buffers.end(), cl.buffers.begin(), cl.buffers.end());
        }
        /* Capture must not change module state (a CUDA capture does not execute at all). */
        gr::BufferSnapshot snap(all_buffers);
        for (size_t i = 0; i < n; i++)
            gr::in_context("callable " + std::to_string(i) + " forward capture", GR_EINVAL, [&] {
                pool.family->capture_forward(*cap->callables[i], pool.state.get());
            });
        for (size_t i = n; i-- > 0;)
            if (cap->callables[i]->has_backward)
                gr::in_context(
                    "callable " + std::to_string(i) + " backward capture", GR_EINVAL,
                    [&] { pool.family->capture_backward(*cap->callables[i], pool.state.get()); });
        for (auto &cl : cap->callables)
            cl->live.clear();
        snap.restore();

        std::vector<std::unique_ptr<gr_graph>> made;
        for (size_t i = 0; i < n; i++) {
            auto g = std::make_unique<gr_graph>();
            g->pool = cap->pool;
            g->callable = std::move(cap->callables[i]);
            made.push_back(std::move(g));
        }
        for (size_t i = 0; i < n; i++)
            graphs[i] = made[i].release();
        return GR_OK;
    } catch (const std::exception &e) {
        return gr::fail_with(e, GR_EINVAL);
    } catch (...) {
        return gr::fail_unknown("gr_capture_finish");
    }
}

extern "C" int gr_capture_abort(gr_capture_t *c)
{
    try {
        if (c == nullptr)
            return gr__set_error(GR_EINVAL, "gr_capture_abort: NULL capture");
        delete c;
        return GR_OK;
    } catch (const std::exception &e) {
        return gr::fail_with(e, GR_EINTERNAL);
    } catch (...) {
        return gr::fail_unknown("gr_capture_abort");
    }
}

namespace
{

/* gr_graph_replay in every mode: the phase protocol around the family's replay. */
int replay(gr_graph_t *g, int phase, const gr::Order *order, uint64_t *elapsed_ns)
{
    gr::Callable &c = *g->callable;
    const gr::Family &family = *g->pool->family;
    gr::CallMemoryBound bound;
    auto t0 = std::chrono::steady_clock::now();
    c10::AutoGradMode grad_mode(true);
    if (phase == GR_PHASE_FORWARD) {
        g->forward_pending = false;
        family.replay_forward(c, order);
        g->forward_pending = c.has_backward;
        g->forward_replays++;
    } else if (phase == GR_PHASE_BACKWARD) {
        if (!c.has_backward)
            return gr__set_error(GR_EPRECOND,
                                 "no output of this graph requires grad: it has no backward");
        if (!g->forward_pending)
            return gr__set_error(GR_EPRECOND, "BACKWARD needs a FORWARD since the last BACKWARD");
        g->forward_pending = false;
        family.replay_backward(c, order);
        g->backward_replays++;
    } else {
        return gr__set_errorf(GR_EINVAL, "phase %d is neither FORWARD nor BACKWARD", phase);
    }
    if (elapsed_ns != nullptr)
        *elapsed_ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                std::chrono::steady_clock::now() - t0)
                                                .count());
    return GR_OK;
}

/* GR_OK for a device-resident graph, else GR_EINVAL (set): what ("an ordered replay") needs one. */
int check_resident(const gr_graph_t *g, const char *what)
{
    if (g->callable->resident)
        return GR_OK;
    return gr__set_errorf(GR_EINVAL,
                          "%s needs a device-resident graph (this one is %s: its replays are "
                          "synchronous)",
                          what, g->pool->family->staged() ? "host-staged" : "on the host");
}

/* For a replay ordered on another process's stream (what: "an ordered replay"), whose ordering
 * objects (objects: "events are") are on devices a and b (family and index): GR_OK, or GR_EINVAL
 * (set) for a graph that is not device-resident or objects on another device than the graph's. */
int check_stream_ordered(const gr_graph_t *g, const char *what, const char *objects,
                         const gr::Family *fa, int a, const gr::Family *fb, int b)
{
    const gr::Callable &c = *g->callable;
    int rc = check_resident(g, what);
    if (rc != GR_OK)
        return rc;
    const gr::Family *family = g->pool->family;
    const int index = static_cast<int>(c.device.index());
    if (fa != family || a != index || fb != family || b != index) {
        const bool first = fa != family || a != index;
        return gr__set_errorf(GR_EINVAL, "the graph is on %s:%d but its %s on %s:%d",
                              family->kind(), index, objects, (first ? fa : fb)->kind(),
                              first ? a : b);
    }
    return GR_OK;
}

template <typename F> int guarded_replay(gr_graph_t *g, const char *fn, F &&body)
{
    try {
        return body();
    } catch (const std::exception &e) {
        g->callable->live.clear();
        g->failed_replays++;
        return gr::fail_with(e, GR_EINTERNAL);
    } catch (...) {
        g->callable->live.clear();
        g->failed_replays++;
        return gr::fail_unknown(fn);
    }
}

/* A posted replay (order by counters): whatever fails, done = n is written (gr_seq_skip) so that
 * the client's stream goes on, and the replay's error (not the skip's) is kept. */
int replay_posted(gr_graph_t *g, int phase, gr_seq_t *s, uint64_t n, uint64_t *elapsed_ns,
                  bool also_events)
{
    if (n == 0)
        return gr__set_error(GR_EINVAL, "gr_graph_replay: NULL counters or sequence 0");
    int rc = GR_EINVAL;
    if (g == nullptr) {
        gr__set_error(rc, "gr_graph_replay: NULL graph");
    } else if (also_events) {
        gr__set_error(rc, "gr_graph_replay: an order names events (wait, done) or sequence "
                          "counters (seq, n), not both");
    } else {
        rc = check_stream_ordered(g, "a posted replay", "sequence counters are", s->family,
                                  s->device, s->family, s->device);
        if (rc == GR_OK) {
            gr::Order order;
            order.seq = s;
            order.n = n;
            rc = guarded_replay(g, "gr_graph_replay",
                                [&] { return replay(g, phase, &order, elapsed_ns); });
        }
    }
    if (rc != GR_OK) {
        std::string msg = gr_last_error();
        (void)gr_seq_skip(s, n);
        gr__set_error(rc, msg.c_str());
    }
    return rc;
}

} // namespace

extern "C" int gr_graph_replay(gr_graph_t *g, int phase, const gr_order_t *order,
                               uint64_t *elapsed_ns)
{
    if (order != nullptr && order->seq != nullptr)
        return replay_posted(g, phase, order->seq, order->n, elapsed_ns,
                             order->wait != nullptr || order->done != nullptr);
    if (g == nullptr)
        return gr__set_error(GR_EINVAL, "gr_graph_replay: NULL graph");
    if (order == nullptr)
        return guarded_replay(g, "gr_graph_replay",
                              [&] { return replay(g, phase, nullptr, elapsed_ns); });
    int rc = check_resident(g, "an ordered replay");
    if (rc != GR_OK)
        return rc;
    if (order->wait == nullptr && order->done == nullptr)
        return gr__set_error(GR_EINVAL, "gr_graph_replay: an order names events (wait and done) "
                                        "or sequence counters (seq and n); this one names neither "
                                        "(pass NULL for a synchronous replay)");
    if (order->wait == nullptr || order->done == nullptr)
        return gr__set_error(
            GR_EINVAL, "gr_graph_replay: an ordered replay needs both events (wait and done)");
    const gr_event_t *wait = order->wait, *done = order->done;
    rc = check_stream_ordered(g, "an ordered replay", "events are", wait->family, wait->device,
                              done->family, done->device);
    if (rc != GR_OK)
        return rc;
    gr::Order o;
    o.wait = wait->event;
    o.done = done->event;
    return guarded_replay(g, "gr_graph_replay", [&] { return replay(g, phase, &o, elapsed_ns); });
}

extern "C" int gr_graph_destroy(gr_graph_t *g)
{
    try {
        if (g == nullptr)
            return gr__set_error(GR_EINVAL, "gr_graph_destroy: NULL graph");
        delete g;
        return GR_OK;
    } catch (const std::exception &e) {
        return gr::fail_with(e, GR_EINTERNAL);
    } catch (...) {
        return gr::fail_unknown("gr_graph_destroy");
    }
}

extern "C" int gr_graph_info(const gr_graph_t *g, gr_graph_info_t *out)
{
    try {
        if (g == nullptr || out == nullptr)
            return gr__set_error(GR_EINVAL, "gr_graph_info: NULL argument");
        gr::fill_info(*g->callable, *g->pool, out);
        out->forward_replays = g->forward_replays;
        out->backward_replays = g->backward_replays;
        out->failed_replays = g->failed_replays;
        out->forward_pending = g->forward_pending ? 1 : 0;
        return GR_OK;
    } catch (const std::exception &e) {
        return gr::fail_with(e, GR_EINTERNAL);
    } catch (...) {
        return gr::fail_unknown("gr_graph_info");
    }
}

extern "C" int gr_graph_layout(const gr_graph_t *g, size_t *count, gr_tensor_desc_t *items,
                               uint64_t *total_bytes)
{
    try {
        if (g == nullptr || count == nullptr)
            return gr__set_error(GR_EINVAL, "gr_graph_layout: NULL argument");
        gr::copy_layout(*g->callable, count, items, total_bytes);
        return GR_OK;
    } catch (const std::exception &e) {
        return gr::fail_with(e, GR_EINTERNAL);
    } catch (...) {
        return gr::fail_unknown("gr_graph_layout");
    }
}

extern "C" int gr_graph_external(const gr_graph_t *g, size_t *count, gr_external_t *items)
{
    try {
        if (g == nullptr || count == nullptr)
            return gr__set_error(GR_EINVAL, "gr_graph_external: NULL argument");
        gr::copy_out(g->callable->external, count, items);
        return GR_OK;
    } catch (const std::exception &e) {
        return gr::fail_with(e, GR_EINTERNAL);
    } catch (...) {
        return gr::fail_unknown("gr_graph_external");
    }
}

extern "C" int gr_devices(size_t *count, gr_device_info_t *items)
{
    try {
        if (count == nullptr)
            return gr__set_error(GR_EINVAL, "gr_devices: NULL count");
        std::vector<gr_device_info_t> all;
        for (const gr::FamilyRow &row : gr::FAMILY_TABLE)
            if (row.family != nullptr) {
                std::vector<gr_device_info_t> some = row.family().devices();
                all.insert(all.end(), some.begin(), some.end());
            }
        gr::copy_out(all, count, items);
        return GR_OK;
    } catch (const std::exception &e) {
        return gr::fail_with(e, GR_EINTERNAL);
    } catch (...) {
        return gr::fail_unknown("gr_devices");
    }
}
