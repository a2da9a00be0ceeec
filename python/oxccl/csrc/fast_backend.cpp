// The torch backend's fast path: blocking collectives on plain CPU tensors
// without a trip through Python.
//
// torch calls a Python backend through a pybind trampoline: every call
// takes the interpreter lock, converts its arguments and runs Python, 13-15
// us per `dist.all_reduce` before any work. `FastBackend` is a trampoline of
// its own (torch's `PyBackend` finds Python methods only on instances of
// torch's own `Backend` type, so it cannot serve a derived C++ class): a
// blocking all_reduce, broadcast, all_gather_into_tensor or
// reduce_scatter_tensor of dense, contiguous CPU tensors of a type oxccl
// handles goes straight to the communicator through `oxccl_py_collective`
// (the Rust extension's C entry); every other call, and every other method
// torch uses, goes to the Python class deriving from this one
// (`oxccl._torch._Methods`) as before. Errors are raised through `oxccl._torch._raise_raw`, so they
// reach Python as the same `OxcclError` the Python path raises.
//
// Compiled at first use by torch.utils.cpp_extension against the installed
// torch (see `_fast.py`).

#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/py/PyProcessGroup.hpp>
#include <torch/csrc/utils/pyobject_preservation.h>
#include <torch/csrc/utils/pyobject_preservation.h>

#include <cstdint>
#include <string>

namespace {

struct RawError {
  char kind[32];
  int64_t rank;
  char message[1024];
};

using CollectiveFn = int (*)(const void* comm, uint8_t kind, const void* send,
                             size_t send_len, void* recv, size_t recv_len,
                             uint8_t dtype, uint8_t op, size_t root,
                             RawError* err);

// The Rust side's codes (comm-core's Kind, DataType and ReduceOp).
constexpr uint8_t kAllReduce = 1, kAllGather = 2, kReduceScatter = 3, kBroadcast = 4;
constexpr uint8_t kBytes = 1;  // u8: what moving calls use whatever the type
constexpr int kNone = -1;

int dtype_code(at::ScalarType t) {
  switch (t) {
    case at::kChar: return 0;
    case at::kByte: return 1;
    case at::kInt: return 2;
    case at::kUInt32: return 3;
    case at::kLong: return 4;
    case at::kUInt64: return 5;
    case at::kHalf: return 6;
    case at::kFloat: return 7;
    case at::kDouble: return 8;
    case at::kBFloat16: return 9;
    default: return kNone;  // bool and the rest: the Python path decides
  }
}

int op_code(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return 0;
    case c10d::ReduceOp::PRODUCT: return 1;
    case c10d::ReduceOp::MAX: return 2;
    case c10d::ReduceOp::MIN: return 3;
    case c10d::ReduceOp::AVG: return 4;
    default: return kNone;
  }
}

bool plain(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.layout() == at::kStrided &&
         t.is_contiguous();
}

// A call that completed before its work was made.
class DoneWork : public c10d::Work {
 public:
  explicit DoneWork(std::vector<at::Tensor> result) : result_(std::move(result)) {}
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds) override { return true; }
  std::vector<at::Tensor> result() override { return result_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    auto f = c10::make_intrusive<c10::ivalue::Future>(
        c10::ListType::create(c10::TensorType::get()));
    f->markCompleted(c10::IValue(result_));
    return f;
  }

 private:
  std::vector<at::Tensor> result_;
};

}  // namespace

// The Python method `name` of this backend's Python object, called with
// the arguments; its work kept with its Python object (torch's holder).
// Without such a method, torch's default (an error naming the call).
#define OX_TO_PYTHON(name, ...)                                              \
  do {                                                                       \
    pybind11::gil_scoped_acquire gil;                                        \
    pybind11::function f =                                                   \
        pybind11::get_override(static_cast<const FastBackend*>(this), #name); \
    if (f) {                                                                 \
      auto o = f(__VA_ARGS__);                                               \
      if (o.is_none()) {                                                     \
        return c10::intrusive_ptr<c10d::Work>();                             \
      }                                                                      \
      return c10::make_intrusive<c10d::PyProcessGroup::PyWorkHolder>(        \
          std::move(o));                                                     \
    }                                                                        \
    return c10d::Backend::name(__VA_ARGS__);                                 \
  } while (false)

using Tensors = std::vector<at::Tensor>;
using TensorLists = std::vector<std::vector<at::Tensor>>;
using Work = c10::intrusive_ptr<c10d::Work>;

class FastBackend : public c10d::Backend {
 public:
  FastBackend(int rank, int size) : c10d::Backend(rank, size) {}

  // The Rust entry and communicator (`Comm.raw_entry()`); until set, every
  // call takes the Python path. `self` is this backend's Python object,
  // tied to this C++ object the way torch ties the backends a Python
  // `split` returns: the Python methods live as long as the backend.
  void set_entry(pybind11::object self, uintptr_t fn, uintptr_t comm) {
    PyObject* kept = torch::utils::PyObjectPreservation::get_or_init(
        *this, [&]() { return Py_NewRef(self.ptr()); });
    Py_DECREF(kept);
    fn_ = reinterpret_cast<CollectiveFn>(fn);
    comm_ = reinterpret_cast<const void*>(comm);
  }

  // -- the fast path, else Python ---------------------------------------

  Work allreduce(Tensors& tensors, const c10d::AllreduceOptions& opts) override {
    if (fn_ && !opts.asyncOp && tensors.size() == 1 && plain(tensors[0])) {
      auto& t = tensors[0];
      int dt = dtype_code(t.scalar_type()), op = op_code(opts.reduceOp);
      if (dt != kNone && op != kNone) {
        run(kAllReduce, nullptr, 0, t.data_ptr(), t.nbytes(), dt, op, 0);
        return c10::make_intrusive<DoneWork>(tensors);
      }
    }
    OX_TO_PYTHON(allreduce, tensors, opts);
  }

  Work broadcast(Tensors& tensors, const c10d::BroadcastOptions& opts) override {
    if (fn_ && !opts.asyncOp && tensors.size() == 1 && plain(tensors[0]) &&
        opts.rootRank >= 0 && opts.rootRank < getSize()) {
      auto& t = tensors[0];
      run(kBroadcast, nullptr, 0, t.data_ptr(), t.nbytes(), kBytes, 0, opts.rootRank);
      return c10::make_intrusive<DoneWork>(tensors);
    }
    OX_TO_PYTHON(broadcast, tensors, opts);
  }

  Work all_gather_single(at::Tensor& output, at::Tensor& input,
                         const c10d::AllgatherOptions& opts) override {
    if (fn_ && !opts.asyncOp && plain(output) && plain(input) &&
        output.scalar_type() == input.scalar_type() &&
        output.numel() == input.numel() * getSize()) {
      run(kAllGather, input.data_ptr(), input.nbytes(), output.data_ptr(),
          output.nbytes(), kBytes, 0, 0);
      return c10::make_intrusive<DoneWork>(Tensors{output});
    }
    OX_TO_PYTHON(all_gather_single, output, input, opts);
  }

  Work reduce_scatter_single(at::Tensor& output, at::Tensor& input,
                             const c10d::ReduceScatterOptions& opts) override {
    if (fn_ && !opts.asyncOp && plain(output) && plain(input) &&
        output.scalar_type() == input.scalar_type() &&
        input.numel() == output.numel() * getSize()) {
      int dt = dtype_code(output.scalar_type()), op = op_code(opts.reduceOp);
      if (dt != kNone && op != kNone) {
        run(kReduceScatter, input.data_ptr(), input.nbytes(), output.data_ptr(),
            output.nbytes(), dt, op, 0);
        return c10::make_intrusive<DoneWork>(Tensors{output});
      }
    }
    OX_TO_PYTHON(reduce_scatter_single, output, input, opts);
  }

  // -- Python only ---------------------------------------------------------

  Work allreduce_coalesced(Tensors& tensors,
                           const c10d::AllreduceCoalescedOptions& opts) override {
    OX_TO_PYTHON(allreduce_coalesced, tensors, opts);
  }
  Work reduce(Tensors& tensors, const c10d::ReduceOptions& opts) override {
    OX_TO_PYTHON(reduce, tensors, opts);
  }
  Work allgather(TensorLists& outputs, Tensors& inputs,
                 const c10d::AllgatherOptions& opts) override {
    OX_TO_PYTHON(allgather, outputs, inputs, opts);
  }
  Work allgather_coalesced(TensorLists& outputs, Tensors& inputs,
                           const c10d::AllgatherOptions& opts) override {
    OX_TO_PYTHON(allgather_coalesced, outputs, inputs, opts);
  }
  Work all_gather_single_coalesced(Tensors& outputs, Tensors& inputs,
                                   const c10d::AllgatherOptions& opts) override {
    OX_TO_PYTHON(all_gather_single_coalesced, outputs, inputs, opts);
  }
  Work gather(TensorLists& outputs, Tensors& inputs,
              const c10d::GatherOptions& opts) override {
    OX_TO_PYTHON(gather, outputs, inputs, opts);
  }
  Work scatter(Tensors& outputs, TensorLists& inputs,
               const c10d::ScatterOptions& opts) override {
    OX_TO_PYTHON(scatter, outputs, inputs, opts);
  }
  Work reduce_scatter(Tensors& outputs, TensorLists& inputs,
                      const c10d::ReduceScatterOptions& opts) override {
    OX_TO_PYTHON(reduce_scatter, outputs, inputs, opts);
  }
  Work reduce_scatter_single_coalesced(Tensors& outputs, Tensors& inputs,
                                       const c10d::ReduceScatterOptions& opts) override {
    OX_TO_PYTHON(reduce_scatter_single_coalesced, outputs, inputs, opts);
  }
  Work all_to_all_single(at::Tensor& output, at::Tensor& input,
                         std::vector<int64_t>& output_splits,
                         std::vector<int64_t>& input_splits,
                         const c10d::AllToAllOptions& opts) override {
    OX_TO_PYTHON(all_to_all_single, output, input, output_splits, input_splits, opts);
  }
  Work alltoall(Tensors& outputs, Tensors& inputs,
                const c10d::AllToAllOptions& opts) override {
    OX_TO_PYTHON(alltoall, outputs, inputs, opts);
  }
  Work send(Tensors& tensors, int dst, int tag) override {
    OX_TO_PYTHON(send, tensors, dst, tag);
  }
  Work recv(Tensors& tensors, int src, int tag) override {
    OX_TO_PYTHON(recv, tensors, src, tag);
  }
  Work recvAnysource(Tensors& tensors, int tag) override {
    pybind11::gil_scoped_acquire gil;
    python("recv_anysource")(tensors, tag);
    return {};
  }
  Work barrier(const c10d::BarrierOptions& opts) override {
    OX_TO_PYTHON(barrier, opts);
  }
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override {
    pybind11::gil_scoped_acquire gil;
    python("monitored_barrier")(opts, wait_all_ranks);
  }

  const std::string getBackendName() const override { return "oxccl"; }
  bool supportsSplitting() const override { return true; }
  bool supportsCoalescing() const override { return false; }

  c10::intrusive_ptr<Options> getBackendOptions() override {
    pybind11::gil_scoped_acquire gil;
    return python("options").cast<c10::intrusive_ptr<Options>>();
  }

  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override {
    pybind11::gil_scoped_acquire gil;
    pybind11::object o = python("split")(store, ranks, opts);
    // The new backend set its own Python object into its slot
    // (`set_entry`), so it outlives this reference.
    return o.cast<c10::intrusive_ptr<c10d::Backend>>();
  }

  void abort() override {
    pybind11::gil_scoped_acquire gil;
    python("abort")();
  }

  void shutdown() override {
    pybind11::gil_scoped_acquire gil;
    python("shutdown")();
  }

 private:
  // This backend's Python object's attribute `name` (a method's bound
  // function, or a property's value). Needs the interpreter lock.
  pybind11::object python(const char* name) const {
    auto self = pybind11::cast(static_cast<const FastBackend*>(this));
    return self.attr(name);
  }

  // Run one blocking collective without the interpreter lock; raise its
  // error as Python's OxcclError.
  void run(uint8_t kind, const void* send, size_t send_len, void* recv,
           size_t recv_len, int dtype, int op, int64_t root) {
    RawError err;
    int rc;
    {
      // Whether the caller holds the lock depends on torch's binding: let
      // go of it only if held.
      bool held = PyGILState_Check();
      PyThreadState* saved = held ? PyEval_SaveThread() : nullptr;
      rc = fn_(comm_, kind, send, send_len, recv, recv_len,
               static_cast<uint8_t>(dtype), static_cast<uint8_t>(op),
               static_cast<size_t>(root), &err);
      if (held) PyEval_RestoreThread(saved);
    }
    if (rc == 0) return;
    pybind11::gil_scoped_acquire gil;
    pybind11::module_::import("oxccl._torch")
        .attr("_raise_raw")(std::string(err.kind), err.rank, std::string(err.message));
    throw std::runtime_error(err.message);  // not reached: _raise_raw raises
  }

  CollectiveFn fn_ = nullptr;
  const void* comm_ = nullptr;
};

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  pybind11::class_<FastBackend, c10d::Backend, c10::intrusive_ptr<FastBackend>>(
      m, "FastBackend")
      .def(pybind11::init<int, int>(), pybind11::arg("rank"), pybind11::arg("size"))
      .def("_set_entry", &FastBackend::set_entry, pybind11::arg("self_object"),
           pybind11::arg("fn"), pybind11::arg("comm"));
}
