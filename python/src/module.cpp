//===- module.cpp - The pagedc Python extension (pagedc._pagedc) ----------===//
//
// A thin pybind11 layer over the C++ API: compileModsFromSource(), the
// PagedKVCache, block masks, flexAttention(), the serving batch call and
// merge_state. Tensors come in through
// DLPack (any object with __dlpack__, wrapped without a copy as a
// TensorView) and go out as pagedc Tensor objects that export DLPack
// capsules, so NumPy and PyTorch read the results without a copy. The
// pure-Python layer (python/pagedc/__init__.py) gives the user-facing,
// flex_attention-shaped API on top of this.
//
// Errors: pagedc::Error (every runtime input check) becomes pagedc.Error, a
// ValueError; compile failures are returned as diagnostics text for the
// Python layer to raise pagedc.CompileError with their location.
//
//===----------------------------------------------------------------------===//

#include "JIT/CompileSource.h"
#include "pagedc/Attention.h"
#include "pagedc/BatchAttention.h"
#include "pagedc/BlockMask.h"
#include "pagedc/CudaAttention.h"
#include "pagedc/CudaDriver.h"
#include "pagedc/Error.h"
#include "pagedc/KVCache.h"
#include "pagedc/KernelOptions.h"
#include "pagedc/Mods.h"
#include "pagedc/PhysicalBlockMask.h"
#include "pagedc/ProgramFile.h"
#include "pagedc/Tensor.h"
#include "cuda/CudaGraph.h"

#include "llvm/Support/raw_ostream.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace py = pybind11;
using namespace pagedc;

namespace {

//===----------------------------------------------------------------------===//
// DLPack
//===----------------------------------------------------------------------===//

/// DLPack's DLManagedTensor (unversioned ABI), over pagedc's DLTensor layout.
struct DLManagedTensor {
  PagedcDLTensor dl_tensor;
  void *manager_ctx;
  void (*deleter)(DLManagedTensor *self);
};

/// A borrowed input tensor: the view and the capsule (or exporter) that keeps
/// its memory alive for as long as this object lives.
struct BorrowedTensor {
  TensorView view;
  py::object keepAlive;
};

/// DLPack's device type of CUDA memory (kDLCUDA).
constexpr int kDLCUDA = 2;

/// Where a call runs: the device every tensor must be on and the CUstream
/// the call enqueues on, which CUDA producers are told through
/// __dlpack__(stream=...) so that their data is ready on it.
struct CallDevice {
  Device device = Device::cpu();
  uintptr_t stream = 0; // a CUstream; 0: the legacy default stream
  bool anyDevice = false; // true: tensors on other devices are accepted
  void *cuStream() const { return reinterpret_cast<void *>(stream); }
  /// The stream as DLPack's consumers name it (1: the legacy default).
  int64_t dlpackStream() const { return stream ? static_cast<int64_t>(stream) : 1; }
};

/// Wraps `obj` (anything with __dlpack__, or a pagedc Tensor) as a TensorView
/// without copying. `argument` names it in errors (ValueError). With `call`,
/// a CUDA producer is asked for its data on the call's stream and the tensor
/// must be on the call's device.
BorrowedTensor borrowTensor(const py::handle &obj, const std::string &argument,
                            const CallDevice *call = nullptr);

/// An owning tensor handed to Python: host storage or a view into storage
/// that `owner` keeps alive (a cache's K/V pages).
class Tensor {
public:
  Tensor() = default;
  explicit Tensor(HostTensor storage) : host_(std::make_shared<HostTensor>(std::move(storage))) {
    view_ = host_->view();
  }
  Tensor(TensorView view, std::shared_ptr<void> owner, void *stream = nullptr)
      : view_(view), owner_(std::move(owner)), stream_(stream) {}

  const TensorView &view() const { return view_; }
  std::vector<int64_t> shape() const { return view_.shape(); }
  std::vector<int64_t> strides() const { return view_.strides(); }
  std::string dtype() const { return dtypeName(view_.dtype()); }
  uintptr_t dataPtr() const { return reinterpret_cast<uintptr_t>(view_.data()); }
  std::string device() const { return deviceName(view_.device()); }
  /// Device tensors: the CUstream the call that wrote it enqueued on.
  void *stream() const { return stream_; }
  const std::shared_ptr<void> &owner() const { return owner_; }

private:
  TensorView view_;
  std::shared_ptr<HostTensor> host_;
  std::shared_ptr<void> owner_;
  void *stream_ = nullptr;
};

/// Waits for the work that writes `tensor` when a consumer reads it on
/// another stream (DLPack: `consumerStream` 1 or 0 is the legacy default
/// stream, -1 asks for no synchronisation).
void syncForConsumer(const Tensor &tensor, const py::object &consumerStream) {
  if (tensor.view().device().kind != DeviceKind::CUDA || consumerStream.is_none())
    return;
  if (!py::isinstance<py::int_>(consumerStream))
    throw py::value_error("stream: expected an int (DLPack's stream number) or None");
  int64_t consumer = consumerStream.cast<int64_t>();
  if (consumer == -1)
    return;
  uintptr_t producer = reinterpret_cast<uintptr_t>(tensor.stream());
  if (consumer == 1 || consumer == 0)
    consumer = 0;
  if (static_cast<uintptr_t>(consumer) == producer)
    return;
  py::gil_scoped_release release;
  const CudaDriver &driver = cudaUseDevice(tensor.view().device().index);
  driver.check(driver.api().streamSynchronize(static_cast<cu::Stream>(tensor.stream())),
               "cuStreamSynchronize");
}

/// A new compact tensor in device memory (cuMemAlloc; contents undefined).
Tensor deviceTensor(DType dtype, const std::vector<int64_t> &shape, Device device,
                    void *stream = nullptr) {
  size_t bytes = dtypeSize(dtype);
  for (int64_t size : shape) {
    if (size < 0)
      throw py::value_error("shape: sizes must be >= 0, got " + std::to_string(size));
    if (size != 0 && bytes > std::numeric_limits<size_t>::max() / static_cast<size_t>(size))
      throw py::value_error("shape: the tensor's size in bytes overflows size_t");
    bytes *= static_cast<size_t>(size);
  }
  auto buffer = std::make_shared<DeviceBuffer>(std::max<size_t>(bytes, 1), device.index);
  return Tensor(TensorView(buffer->data(), dtype, shape, device), buffer, stream);
}

struct ExportContext {
  PyObject *owner = nullptr;     // a strong reference to the exported Tensor, or
  std::shared_ptr<void> storage; // the storage itself when no Python object holds it
  std::vector<int64_t> shape, strides;
};

void deleteExported(DLManagedTensor *managed) {
  auto *context = static_cast<ExportContext *>(managed->manager_ctx);
  if (context->owner) {
    // The consumer may call the deleter from any thread.
    PyGILState_STATE state = PyGILState_Ensure();
    Py_XDECREF(context->owner);
    PyGILState_Release(state);
  }
  delete context;
  delete managed;
}

void capsuleDestructor(PyObject *capsule) {
  // Only an unconsumed capsule ("dltensor") still owns its tensor; a consumer
  // renames it "used_dltensor" and calls the deleter itself.
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto *managed = static_cast<DLManagedTensor *>(PyCapsule_GetPointer(capsule, "dltensor"));
    if (managed && managed->deleter)
      managed->deleter(managed);
  } else {
    PyErr_Clear();
  }
}

/// A "dltensor" capsule of `view` whose exporter `context` (owned by the
/// capsule from here on, freed by its deleter) keeps the memory alive.
py::capsule capsuleOf(const TensorView &view, ExportContext *context) {
  context->shape = view.shape();
  context->strides = view.strides();
  auto *managed = new DLManagedTensor;
  managed->dl_tensor = view.toDLPack();
  managed->dl_tensor.shape = context->shape.data();
  managed->dl_tensor.strides = context->strides.data();
  managed->manager_ctx = context;
  managed->deleter = deleteExported;
  PyObject *capsule = PyCapsule_New(managed, "dltensor", capsuleDestructor);
  if (!capsule) {
    deleteExported(managed);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(capsule);
}

py::capsule exportDLPack(py::object self, const py::object &stream) {
  const Tensor &tensor = self.cast<const Tensor &>();
  syncForConsumer(tensor, stream);
  auto *context = new ExportContext;
  context->owner = self.release().ptr();
  return capsuleOf(tensor.view(), context);
}

/// A DLPack capsule of a host `view` that `storage` keeps alive, made without
/// a pagedc.Tensor in between: an attention call's new output handed to torch
/// costs a Python object and a method call less.
py::capsule exportHostView(const TensorView &view, std::shared_ptr<void> storage) {
  auto *context = new ExportContext;
  context->storage = std::move(storage);
  return capsuleOf(view, context);
}

/// Checks that `view` is on the call's device.
void checkDevice(const TensorView &view, const std::string &argument, const CallDevice &call) {
  if (!call.anyDevice && view.device() != call.device)
    throw py::value_error(argument + ": is on " + deviceName(view.device()) +
                          " but the call runs on " + deviceName(call.device));
}

/// obj.__dlpack__(), with the call's stream when obj's memory is CUDA's.
py::object dlpackCapsule(const py::handle &obj, const std::string &argument,
                         const CallDevice *call) {
  int deviceType = 1;
  try {
    if (py::hasattr(obj, "__dlpack_device__"))
      deviceType = py::cast<py::tuple>(obj.attr("__dlpack_device__")())[0].cast<int>();
    if (deviceType == kDLCUDA)
      return obj.attr("__dlpack__")(py::arg("stream") = call ? call->dlpackStream() : 1);
    return obj.attr("__dlpack__")();
  } catch (py::error_already_set &error) {
    // e.g. NumPy refuses to export read-only or non-native-endian arrays.
    throw py::value_error(argument + ": cannot be exported through DLPack: " +
                          std::string(py::str(error.value())));
  }
}

BorrowedTensor borrowCapsule(py::object capsule, const std::string &argument,
                             const CallDevice *call);

BorrowedTensor borrowTensor(const py::handle &obj, const std::string &argument,
                            const CallDevice *call) {
  if (py::isinstance<Tensor>(obj)) {
    const Tensor &tensor = obj.cast<const Tensor &>();
    if (call)
      checkDevice(tensor.view(), argument, *call);
    return {tensor.view(), py::reinterpret_borrow<py::object>(obj)};
  }
  // A capsule the caller exported already (the Python layer does so for
  // torch's host tensors, whose __dlpack__ method is slow to call).
  if (PyCapsule_CheckExact(obj.ptr()))
    return borrowCapsule(py::reinterpret_borrow<py::object>(obj), argument, call);
  if (!py::hasattr(obj, "__dlpack__"))
    throw py::value_error(argument + ": expected a tensor with __dlpack__ (a NumPy array, a "
                          "PyTorch tensor or a pagedc.Tensor), got " +
                          std::string(py::str(py::type::handle_of(obj).attr("__name__"))));
  return borrowCapsule(dlpackCapsule(obj, argument, call), argument, call);
}

BorrowedTensor borrowCapsule(py::object capsule, const std::string &argument,
                             const CallDevice *call) {
  if (!PyCapsule_IsValid(capsule.ptr(), "dltensor"))
    throw py::value_error(argument + ": not an unconsumed DLPack capsule");
  auto *managed =
      static_cast<DLManagedTensor *>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  TensorView view;
  try {
    view = TensorView::fromDLPack(managed->dl_tensor);
  } catch (const Error &error) {
    throw py::value_error(argument + ": " + error.what());
  }
  if (call)
    checkDevice(view, argument, *call);
  // The capsule stays unconsumed: its destructor calls the producer's deleter
  // when the last reference goes, after the call that borrowed the view.
  return {view, capsule};
}

//===----------------------------------------------------------------------===//
// Device memory
//===----------------------------------------------------------------------===//

/// The CUDA device `index` of the process's driver; ValueError naming
/// `device` when there is no driver or no such device.
Device cudaDevice(int index) {
  std::string reason;
  if (!CudaDriver::available(&reason))
    throw py::value_error("device: no CUDA driver: " + reason);
  int count = CudaDriver::get().deviceCount();
  if (index < 0 || index >= count)
    throw py::value_error("device: cuda:" + std::to_string(index) + " does not exist (" +
                          std::to_string(count) + " device(s))");
  return Device::cuda(index);
}

/// (driver available, emulated, library or the reason there is none).
py::tuple cudaDriverInfo() {
  std::string reason;
  if (!CudaDriver::available(&reason))
    return py::make_tuple(false, false, reason);
  const CudaDriver &driver = CudaDriver::get();
  return py::make_tuple(true, driver.emulated(), driver.libraryPath());
}

/// Every `step`-th element of `tensor`'s last dimension, as a view of the same
/// memory with that stride (tests use it for the refusal of strides).
Tensor stridedView(const Tensor &tensor, int64_t step, int64_t columns) {
  const TensorView &v = tensor.view();
  if (step < 1 || v.rank() == 0)
    throw py::value_error("step: must be >= 1, on a tensor of rank >= 1");
  std::vector<int64_t> shape = v.shape(), strides = v.strides();
  if (columns >= 0) {
    if (columns > shape.back())
      throw py::value_error("columns: more than the last dimension holds");
    shape.back() = columns;
  }
  shape.back() = (shape.back() + step - 1) / step;
  strides.back() *= step;
  return Tensor(TensorView(v.data(), v.dtype(), shape, strides, v.device()), tensor.owner(),
                tensor.stream());
}

/// A CUDA stream of pagedc's own (cuStreamCreate), for callers without a
/// framework that owns streams; destroyed with the object.
class Stream {
public:
  explicit Stream(int index) : device_(cudaDevice(index)) {
    const CudaDriver &driver = cudaUseDevice(index);
    cu::Stream stream = nullptr;
    driver.check(driver.api().streamCreate(&stream, 0), "cuStreamCreate");
    stream_ = stream;
  }
  ~Stream() {
    if (stream_)
      cudaUseDevice(device_.index).api().streamDestroy(stream_);
  }
  Stream(const Stream &) = delete;
  Stream &operator=(const Stream &) = delete;
  uintptr_t handle() const { return reinterpret_cast<uintptr_t>(stream_); }
  cu::Stream stream() const { return stream_; }
  int deviceIndex() const { return device_.index; }
  std::string device() const { return deviceName(device_); }
  void synchronize() const {
    py::gil_scoped_release release;
    const CudaDriver &driver = cudaUseDevice(device_.index);
    driver.check(driver.api().streamSynchronize(stream_), "cuStreamSynchronize");
  }

private:
  Device device_;
  cu::Stream stream_ = nullptr;
};

/// A CUDA graph captured from a Stream, shaped like torch.cuda.CUDAGraph:
/// captureBegin(stream), the calls whose work is captured, captureEnd(),
/// then replay() as often as needed. The capture is global: the driver
/// refuses allocation, host copies and synchronisation while it lasts, so a
/// call that does any of them cannot be captured.
class Graph {
public:
  void captureBegin(std::shared_ptr<Stream> stream) {
    if (capture_ || exec_)
      throw py::value_error("capture_begin: the graph is capturing or captured already");
    const CudaDriver &driver = cudaUseDevice(stream->deviceIndex());
    capture_ = std::make_unique<CudaStreamCapture>(driver, stream->stream());
    stream_ = std::move(stream);
  }
  void captureEnd() {
    if (!capture_)
      throw py::value_error("capture_end: no capture in progress (capture_begin first)");
    // A failed capture ends it all the same (the stream runs work again).
    std::unique_ptr<CudaStreamCapture> capture = std::move(capture_);
    exec_ = capture->end();
  }
  void replay() const {
    if (!exec_)
      throw py::value_error("replay: nothing captured (capture_begin, capture_end first)");
    cudaUseDevice(stream_->deviceIndex());
    exec_.launch(stream_->stream());
  }

private:
  std::shared_ptr<Stream> stream_;
  std::unique_ptr<CudaStreamCapture> capture_;
  CudaGraphExec exec_;
};

/// A copy of host tensor `obj` (any strides) in new device memory, compact.
Tensor toDevice(const py::handle &obj, int index) {
  Device device = cudaDevice(index);
  BorrowedTensor source = borrowTensor(obj, "array");
  const TensorView &v = source.view;
  if (v.device().kind != DeviceKind::CPU)
    throw py::value_error("array: must be in host memory, got a tensor on " +
                          deviceName(v.device()));
  if (!v.isContiguous())
    throw py::value_error("array: must be contiguous (row-major)");
  Tensor result = deviceTensor(v.dtype(), v.shape(), device);
  auto *buffer = static_cast<DeviceBuffer *>(result.owner().get());
  py::gil_scoped_release release;
  buffer->upload(v.data(), static_cast<size_t>(v.numel()) * dtypeSize(v.dtype()));
  return result;
}

/// A host copy of device tensor `obj` (compact), after the work that writes it.
Tensor toHost(const py::handle &obj) {
  BorrowedTensor source = borrowTensor(obj, "tensor");
  const TensorView &v = source.view;
  if (v.device().kind != DeviceKind::CUDA)
    throw py::value_error("tensor: must be in CUDA memory, got a tensor on " +
                          deviceName(v.device()));
  if (!v.isContiguous())
    throw py::value_error("tensor: must be contiguous (row-major)");
  void *stream = py::isinstance<Tensor>(obj) ? obj.cast<const Tensor &>().stream() : nullptr;
  HostTensor host(v.dtype(), v.shape());
  const size_t bytes = static_cast<size_t>(v.numel()) * dtypeSize(v.dtype());
  {
    py::gil_scoped_release release;
    const CudaDriver &driver = cudaUseDevice(v.device().index);
    driver.check(driver.api().streamSynchronize(static_cast<cu::Stream>(stream)),
                 "cuStreamSynchronize");
    if (bytes)
      driver.check(driver.api().memcpyDtoH(host.data(),
                                           reinterpret_cast<cu::DevicePointer>(v.data()), bytes),
                   "cuMemcpyDtoH");
  }
  return Tensor(std::move(host));
}

//===----------------------------------------------------------------------===//
// Compiled mods
//===----------------------------------------------------------------------===//

struct Mods {
  CompiledMods mods;
};

struct SourceCompileResult {
  std::shared_ptr<Mods> mods; // null on failure
  std::string diagnostics;    // the compiler's located diagnostics
  std::string error;          // the summary error when it failed
};

SourceCompileResult compileSource(const std::string &fileName, const std::string &source,
                                  const std::string &mask, const std::string &score,
                                  const std::vector<std::pair<std::string, std::string>> &defines,
                                  bool withCuda) {
  jit::SourceCompileOptions options;
  for (const auto &[name, value] : defines)
    options.constOverrides.push_back({name, value});
  options.withCuda = withCuda;
  SourceCompileResult result;
  {
    py::gil_scoped_release release;
    llvm::raw_string_ostream diagnostics(result.diagnostics);
    auto compiled = jit::compileModsFromSource(fileName, source, mask, score, options, diagnostics);
    diagnostics.flush();
    if (compiled)
      result.mods = std::make_shared<Mods>(Mods{std::move(*compiled)});
    else
      result.error = llvm::toString(compiled.takeError());
  }
  return result;
}

py::tuple listMods(const std::string &fileName, const std::string &source,
                   const std::vector<std::pair<std::string, std::string>> &defines) {
  jit::SourceCompileOptions options;
  for (const auto &[name, value] : defines)
    options.constOverrides.push_back({name, value});
  std::string text;
  llvm::raw_string_ostream diagnostics(text);
  auto listed = jit::listModsInSource(fileName, source, options, diagnostics);
  diagnostics.flush();
  py::list mods;
  std::string error;
  if (listed) {
    for (const jit::ModSummary &summary : *listed)
      mods.append(py::make_tuple(summary.name, summary.isMask ? "mask" : "score"));
  } else {
    error = llvm::toString(listed.takeError());
  }
  return py::make_tuple(listed ? py::object(mods) : py::object(py::none()), text, error);
}

py::list bufferDecls(const Mods &self) {
  py::list out;
  for (const BufferDecl &decl : self.mods.buffers) {
    py::list dims;
    for (const BufferDim &dim : decl.dims) {
      if (dim.kind == BufferDim::Fixed)
        dims.append(dim.size);
      else if (dim.kind == BufferDim::Named)
        dims.append(dim.name);
      else
        dims.append("?");
    }
    out.append(py::make_tuple(decl.name, dtypeName(decl.elementType), dims));
  }
  return out;
}

py::list paramDecls(const Mods &self) {
  py::list out;
  for (const ParamDecl &decl : self.mods.params) {
    py::object value = py::none();
    if (decl.defaultValue) {
      const ParamValue &v = *decl.defaultValue;
      value = v.kind == ScalarKind::F32   ? py::object(py::float_(v.f32))
              : v.kind == ScalarKind::I32 ? py::object(py::int_(v.i32))
                                          : py::object(py::bool_(v.boolean));
    }
    out.append(py::make_tuple(decl.name, scalarKindName(decl.type), value));
  }
  return out;
}

/// Bindings from Python dicts; `keep` holds the borrowed buffers.
Bindings makeBindings(const Mods &mods, const py::dict &buffers, const py::dict &params,
                      std::vector<BorrowedTensor> &keep, const CallDevice *call = nullptr) {
  Bindings bindings;
  for (auto item : buffers) {
    std::string name = py::str(item.first);
    keep.push_back(borrowTensor(item.second, "buffers['" + name + "']", call));
    bindings.buffers[name] = keep.back().view;
  }
  for (auto item : params) {
    std::string name = py::str(item.first);
    const ParamDecl *decl = nullptr;
    for (const ParamDecl &candidate : mods.mods.params)
      if (candidate.name == name)
        decl = &candidate;
    py::handle value = item.second;
    if (!decl) {
      std::string declared;
      for (const ParamDecl &p : mods.mods.params)
        declared += (declared.empty() ? "" : ", ") + p.name;
      throw py::value_error("params['" + name + "']: the mods have no param named '" + name +
                            "' (declared: " + (declared.empty() ? "none" : declared) + ")");
    }
    if (decl->type == ScalarKind::Bool) {
      if (!py::isinstance<py::bool_>(value))
        throw py::value_error("params['" + name + "']: expected a bool");
      bindings.params[name] = ParamValue::ofBool(value.cast<bool>());
    } else if (decl->type == ScalarKind::I32) {
      if (!py::isinstance<py::int_>(value) || py::isinstance<py::bool_>(value))
        throw py::value_error("params['" + name + "']: expected an int (param is i32)");
      int64_t v = value.cast<int64_t>();
      if (v < INT32_MIN || v > INT32_MAX)
        throw py::value_error("params['" + name + "']: " + std::to_string(v) +
                              " does not fit in i32");
      bindings.params[name] = ParamValue::ofI32(static_cast<int32_t>(v));
    } else {
      if (py::isinstance<py::bool_>(value) ||
          !(py::isinstance<py::float_>(value) || py::isinstance<py::int_>(value)))
        throw py::value_error("params['" + name + "']: expected a number (param is f32)");
      bindings.params[name] = ParamValue::ofF32(value.cast<float>());
    }
  }
  return bindings;
}

//===----------------------------------------------------------------------===//
// KV cache and block masks
//===----------------------------------------------------------------------===//

DType parseDType(const std::string &name) {
  for (DType type : {DType::F32, DType::F64, DType::F16, DType::BF16})
    if (name == dtypeName(type))
      return type;
  if (name == "float32")
    return DType::F32;
  if (name == "float16")
    return DType::F16;
  if (name == "bfloat16")
    return DType::BF16;
  if (name == "float8_e4m3fn" || name == "f8e4m3")
    return DType::F8E4M3;
  if (name == "float8_e5m2" || name == "f8e5m2")
    return DType::F8E5M2;
  throw py::value_error("dtype: expected 'f32', 'f16', 'bf16', 'float8_e4m3fn' or "
                        "'float8_e5m2', got '" + name + "'");
}

/// The element type `name` spells for a new tensor: parseDType's names and
/// int32, int64, uint8 and bool.
DType parseTensorDType(const std::string &name) {
  for (DType type : {DType::I32, DType::I64, DType::U8, DType::Bool})
    if (name == dtypeName(type))
      return type;
  if (name == "int32")
    return DType::I32;
  if (name == "int64")
    return DType::I64;
  if (name == "uint8")
    return DType::U8;
  if (name == "bool")
    return DType::Bool;
  if (name == "float64")
    return DType::F64;
  return parseDType(name);
}

std::shared_ptr<PagedKVCache> makeCache(int64_t numPages, int64_t pageSize, int64_t maxBatch,
                                        int64_t heads, int64_t headDim, int64_t valueHeadDim,
                                        const std::string &dtype, std::vector<float> kScale,
                                        std::vector<float> vScale, int deviceIndex) {
  KVCacheConfig config;
  if (deviceIndex >= 0)
    config.device = cudaDevice(deviceIndex);
  config.numPages = numPages;
  config.pageSize = pageSize;
  config.maxBatch = maxBatch;
  config.heads = heads;
  config.headDim = headDim;
  config.valueHeadDim = valueHeadDim < 0 ? headDim : valueHeadDim;
  config.dtype = parseDType(dtype);
  config.kScale = std::move(kScale);
  config.vScale = std::move(vScale);
  return std::make_shared<PagedKVCache>(config);
}

template <typename T> py::list toList(const std::vector<T> &values) {
  py::list out;
  for (const T &v : values)
    out.append(v);
  return out;
}

std::vector<int32_t> int32List(const std::vector<int64_t> &values, const char *argument) {
  std::vector<int32_t> out;
  out.reserve(values.size());
  for (int64_t v : values) {
    if (v < INT32_MIN || v > INT32_MAX)
      throw py::value_error(std::string(argument) + ": " + std::to_string(v) +
                            " does not fit in int32");
    out.push_back(static_cast<int32_t>(v));
  }
  return out;
}

Tensor int32Tensor(const std::vector<int32_t> &values, std::vector<int64_t> shape) {
  HostTensor t(DType::I32, std::move(shape));
  if (!values.empty())
    std::memcpy(t.data(), values.data(), values.size() * sizeof(int32_t));
  return Tensor(std::move(t));
}

std::vector<int32_t> int32Values(const py::handle &obj, const char *argument,
                                 int64_t expected) {
  BorrowedTensor t = borrowTensor(obj, argument);
  const TensorView &v = t.view;
  if (v.device() != Device::cpu())
    throw py::value_error(std::string(argument) + ": must be on the CPU");
  if (v.dtype() != DType::I32 && v.dtype() != DType::I64)
    throw py::value_error(std::string(argument) + ": expected int32 or int64, got " +
                          dtypeName(v.dtype()));
  if (v.numel() != expected)
    throw py::value_error(std::string(argument) + ": expected " + std::to_string(expected) +
                          " elements, got shape " + v.shapeString());
  if (!v.isContiguous())
    throw py::value_error(std::string(argument) + ": must be contiguous");
  std::vector<int32_t> out(expected);
  for (int64_t i = 0; i < expected; ++i) {
    int64_t x = v.dtype() == DType::I32 ? v.dataAs<int32_t>()[i] : v.dataAs<int64_t>()[i];
    if (x < INT32_MIN || x > INT32_MAX)
      throw py::value_error(std::string(argument) + ": value does not fit in int32");
    out[i] = static_cast<int32_t>(x);
  }
  return out;
}

std::shared_ptr<BlockMask> createMask(const Mods &mods, const py::dict &buffers,
                                      const py::dict &params, int64_t batch, int64_t heads,
                                      int64_t qBegin, int64_t qLength, int64_t kvLength,
                                      int32_t qBlock, int32_t kvBlock) {
  std::vector<BorrowedTensor> keep;
  Bindings bindings = makeBindings(mods, buffers, params, keep);
  auto mask = std::make_shared<BlockMask>();
  py::gil_scoped_release release;
  ResolvedBindings resolved = resolveBindings(mods.mods, bindings, Device::cpu());
  if (qBegin == 0)
    *mask = createBlockMask(mods.mods, resolved.context(), batch, heads, qLength, kvLength,
                            qBlock, kvBlock);
  else
    *mask = createBlockMaskRows(mods.mods, resolved.context(), batch, heads, qBegin, qLength,
                                kvLength, qBlock, kvBlock);
  return mask;
}

std::vector<int32_t> vectorFrom(const py::handle &obj, const char *argument) {
  BorrowedTensor t = borrowTensor(obj, argument);
  const TensorView &v = t.view;
  if (v.dtype() != DType::I32 && v.dtype() != DType::I64)
    throw py::value_error(std::string(argument) + ": expected int32 or int64, got " +
                          dtypeName(v.dtype()));
  if (!v.isContiguous() || v.device() != Device::cpu())
    throw py::value_error(std::string(argument) + ": must be a contiguous CPU tensor");
  std::vector<int32_t> out(v.numel());
  for (int64_t i = 0; i < v.numel(); ++i) {
    int64_t x = v.dtype() == DType::I32 ? v.dataAs<int32_t>()[i] : v.dataAs<int64_t>()[i];
    if (x < INT32_MIN || x > INT32_MAX)
      throw py::value_error(std::string(argument) + ": value does not fit in int32");
    out[i] = static_cast<int32_t>(x);
  }
  return out;
}

std::shared_ptr<BlockMask> maskFromKvBlocks(py::handle kvNum, py::handle kvIdx, py::handle fullNum,
                                            py::handle fullIdx, int64_t batch, int64_t heads,
                                            int64_t maxKvBlocks, int64_t qLength,
                                            int64_t kvLength, int32_t qBlock, int32_t kvBlock) {
  std::vector<int32_t> a = vectorFrom(kvNum, "kv_num_blocks");
  std::vector<int32_t> b = vectorFrom(kvIdx, "kv_indices");
  std::vector<int32_t> c, d;
  if (!fullNum.is_none())
    c = vectorFrom(fullNum, "full_kv_num_blocks");
  if (!fullIdx.is_none())
    d = vectorFrom(fullIdx, "full_kv_indices");
  return std::make_shared<BlockMask>(blockMaskFromKvBlocks(std::move(a), std::move(b), std::move(c),
                                                           std::move(d), batch, heads, maxKvBlocks,
                                                           qLength, kvLength, qBlock, kvBlock));
}

//===----------------------------------------------------------------------===//
// Attention
//===----------------------------------------------------------------------===//

/// The optional `out` / `lse` arguments of an attention call: borrowed when
/// given, and the call's results as Python objects afterwards (the caller's
/// own objects, or new Tensors that keep `result` alive).
struct CallOutputs {
  BorrowedTensor out, lse;
  CallOutputs(const py::handle &outObj, const py::handle &lseObj,
              const CallDevice *call = nullptr) {
    if (!outObj.is_none())
      out = borrowTensor(outObj, "out", call);
    if (!lseObj.is_none())
      lse = borrowTensor(lseObj, "lse", call);
  }
  /// `capsules`: the tensors the call made come back as DLPack capsules
  /// (host calls only), else as pagedc.Tensors.
  py::tuple results(const std::shared_ptr<AttentionResult> &result, const py::handle &outObj,
                    const py::handle &lseObj, bool returnLse, bool capsules = false) const {
    auto wrap = [&](const TensorView &view) -> py::object {
      if (view.empty() && view.rank() == 0)
        return py::none();
      if (capsules)
        return exportHostView(view, result);
      return py::cast(Tensor(view, result));
    };
    py::object outResult =
        outObj.is_none() ? wrap(result->out) : py::reinterpret_borrow<py::object>(outObj);
    py::object lseResult = py::none();
    if (!lseObj.is_none())
      lseResult = py::reinterpret_borrow<py::object>(lseObj);
    else if (returnLse)
      lseResult = wrap(result->lse);
    return py::make_tuple(outResult, lseResult);
  }
};

/// The arguments of one flexAttention() call, converted from Python once:
/// q borrowed, the mods' bindings resolved (their tensors kept alive) and the
/// per-batch lists checked.
struct PreparedCall {
  std::vector<BorrowedTensor> keep;
  BorrowedTensor q;
  Bindings bindings;
  AttentionOptions options;

  PreparedCall(const py::handle &qObj, const Mods &mods, const py::dict &buffers,
               const py::dict &params, const std::vector<int64_t> &batchIdx,
               const std::vector<int64_t> &kvLength, const std::vector<int64_t> &qOffset,
               int threads, const CallDevice *call = nullptr)
      : q(borrowTensor(qObj, "q", call)),
        bindings(makeBindings(mods, buffers, params, keep, call)) {
    options.batchIdx = int32List(batchIdx, "batch_idx");
    options.kvLength = int32List(kvLength, "kv_length");
    options.qOffset = int32List(qOffset, "q_offset");
    options.threads = threads;
  }
  PreparedCall(const PreparedCall &) = delete;
  PreparedCall &operator=(const PreparedCall &) = delete;
};

/// The call's device (null: the CPU, where the runtime takes q's device):
/// cuda:`deviceIndex` and `stream` when deviceIndex >= 0.
std::optional<CallDevice> callDevice(int deviceIndex, uintptr_t stream) {
  if (deviceIndex < 0)
    return std::nullopt;
  return CallDevice{cudaDevice(deviceIndex), stream};
}

/// Device calls allocate what the caller did not give on the call's device
/// (the runtime allocates host memory): out of `shape` and q's dtype, and
/// lse (`shape` without its last dimension, f32) when asked for.
void allocateDeviceOutputs(const CallDevice &call, DType dtype,
                           const std::vector<int64_t> &shape, bool returnLse, py::object &out,
                           py::object &lse) {
  if (out.is_none())
    out = py::cast(deviceTensor(dtype, shape, call.device, call.cuStream()));
  if (lse.is_none() && returnLse)
    lse = py::cast(deviceTensor(DType::F32, std::vector<int64_t>(shape.begin(), shape.end() - 1),
                                call.device, call.cuStream()));
}

/// The block mask argument: None or a BlockMask. Taken as a handle because
/// pybind11 tries a foreign module's type (an attribute lookup that fails and
/// formats an AttributeError) before it accepts None for a class argument,
/// which costs a fraction of a small call.
std::shared_ptr<BlockMask> blockMaskArgument(const py::handle &obj) {
  if (obj.is_none())
    return nullptr;
  if (!py::isinstance<BlockMask>(obj))
    throw py::value_error("block_mask: expected a BlockMask or None, got " +
                          std::string(py::str(py::type::handle_of(obj).attr("__name__"))));
  return obj.cast<std::shared_ptr<BlockMask>>();
}

/// What an attention call reads its keys and values from: a cache, or
/// dense k [B, Hkv, S, D] and v tensors borrowed for the call, which the CPU
/// backend reads where they lie.
struct CallKeys {
  std::shared_ptr<PagedKVCache> cache;
  BorrowedTensor k, v;

  int64_t valueHeadDim() const {
    if (cache)
      return cache->valueHeadDim();
    return v.view.rank() == 4 ? v.view.size(3) : 0;
  }
};

py::tuple attention(const py::handle &qObj, const CallKeys &keys,
                    const py::handle &blockMaskObj, const Mods &mods, const py::dict &buffers,
                    const py::dict &params, std::vector<int64_t> batchIdx,
                    std::vector<int64_t> kvLength, std::vector<int64_t> qOffset,
                    std::optional<float> scale, bool returnLse, py::object outObj,
                    py::object lseObj, int threads,
                    const std::map<std::string, std::string> &kernelOptions, int deviceIndex,
                    uintptr_t stream, const py::handle &sinksObj, bool capsules = false) {
  const std::optional<CallDevice> device = callDevice(deviceIndex, stream);
  const CallDevice *onDevice = device ? &*device : nullptr;
  const std::shared_ptr<BlockMask> blockMask = blockMaskArgument(blockMaskObj);
  PreparedCall call(qObj, mods, buffers, params, batchIdx, kvLength, qOffset, threads,
                    onDevice);
  BorrowedTensor &q = call.q;
  Bindings &bindings = call.bindings;
  AttentionOptions &options = call.options;
  options.scale = scale;
  options.returnLse = returnLse;
  // NAME -> VALUE text (flex_attention's kernel_options, converted by
  // _api.py); the parser every front end shares names a bad one.
  for (const auto &[name, value] : kernelOptions)
    setKernelOption(options.kernel, name, value);
  checkKernelOptions(options.kernel);
  if (onDevice) {
    if (q.view.rank() != 4)
      throw py::value_error("q: expected [B, Hq, L, D], got shape " + q.view.shapeString());
    allocateDeviceOutputs(*onDevice, q.view.dtype(),
                          {q.view.size(0), q.view.size(1), q.view.size(2), keys.valueHeadDim()},
                          returnLse, outObj, lseObj);
    options.device = onDevice->device;
    options.stream = onDevice->cuStream();
  }
  CallOutputs outputs(outObj, lseObj, onDevice);
  options.out = outputs.out.view;
  options.lse = outputs.lse.view;
  BorrowedTensor sinks;
  if (!sinksObj.is_none())
    sinks = borrowTensor(sinksObj, "sinks", onDevice);
  options.sinks = sinks.view;
  auto result = std::make_shared<AttentionResult>();
  {
    py::gil_scoped_release release;
    *result = keys.cache ? flexAttention(q.view, *keys.cache, blockMask.get(), mods.mods,
                                         bindings, options)
                         : flexAttention(q.view, keys.k.view, keys.v.view, blockMask.get(),
                                         mods.mods, bindings, options);
  }
  return outputs.results(result, outObj, lseObj, returnLse, capsules && !onDevice);
}

/// A host call's per-batch lists (slots, KV lengths, query offsets),
/// converted to int32 and checked once: the Python layer keeps one with a
/// cache's default lists, so a small call skips converting three lists.
struct CallEntries {
  std::vector<int32_t> slots, kvLength, qOffset;
};

/// The host call as a small decode step makes it: a cache, compiled mods
/// without bindings, the default scale, no lse, block mask, sinks or kernel
/// options, and `entries` prepared beforehand. Returns `outObj` when given,
/// else the new output (a DLPack capsule with `capsule`, else a Tensor).
/// Every argument is checked by flexAttention() as on the general path.
py::object attentionHost(const py::handle &qObj, const std::shared_ptr<PagedKVCache> &cache,
                         const Mods &mods, const CallEntries &entries, const py::handle &outObj,
                         int threads, bool capsule) {
  if (!cache)
    throw py::value_error("cache: expected a KVCache");
  BorrowedTensor q = borrowTensor(qObj, "q");
  AttentionOptions options;
  options.batchIdx = entries.slots;
  options.kvLength = entries.kvLength;
  options.qOffset = entries.qOffset;
  options.threads = threads;
  CallOutputs outputs(outObj, py::none());
  options.out = outputs.out.view;
  static const Bindings noBindings;
  auto result = std::make_shared<AttentionResult>();
  {
    py::gil_scoped_release release;
    *result = flexAttention(q.view, *cache, nullptr, mods.mods, noBindings, options);
  }
  if (!outObj.is_none())
    return py::reinterpret_borrow<py::object>(outObj);
  if (capsule)
    return exportHostView(result->out, result);
  return py::cast(Tensor(result->out, result));
}

/// Benchmark support (bench/python/overhead.py): the same call as
/// attention(), but the arguments are converted once and flexAttention() is
/// then timed `repeat` times in a C++ loop, the way a C++ application that
/// holds its views and bindings calls it. Returns the per-call times in ns,
/// so Python's overhead is the public call's time minus these.
std::vector<int64_t> timeCppCalls(const py::handle &qObj, std::shared_ptr<PagedKVCache> cache,
                                  std::shared_ptr<BlockMask> blockMask, const Mods &mods,
                                  const py::dict &buffers, const py::dict &params,
                                  std::vector<int64_t> batchIdx, std::vector<int64_t> kvLength,
                                  std::vector<int64_t> qOffset, const py::handle &outObj,
                                  int threads, int repeat) {
  if (repeat < 1)
    throw Error("repeat must be at least 1");
  PreparedCall call(qObj, mods, buffers, params, batchIdx, kvLength, qOffset, threads);
  BorrowedTensor out = borrowTensor(outObj, "out");
  call.options.out = out.view;
  const BorrowedTensor &q = call.q;
  const Bindings &bindings = call.bindings;
  const AttentionOptions &options = call.options;
  std::vector<int64_t> samples(static_cast<size_t>(repeat));
  py::gil_scoped_release release;
  for (int i = 0; i < repeat; ++i) {
    auto start = std::chrono::steady_clock::now();
    AttentionResult result =
        flexAttention(q.view, *cache, blockMask.get(), mods.mods, bindings, options);
    auto end = std::chrono::steady_clock::now();
    samples[static_cast<size_t>(i)] =
        std::chrono::duration_cast<std::chrono::nanoseconds>(end - start).count();
  }
  return samples;
}

//===----------------------------------------------------------------------===//
// The serving batch call and merge_state
//===----------------------------------------------------------------------===//

/// A BatchAttention and the mods it was built with (kept alive with it).
struct Batch {
  std::shared_ptr<Mods> mods;
  std::unique_ptr<BatchAttention> attention;
};

std::shared_ptr<Batch> makeBatch(std::shared_ptr<Mods> mods, int64_t numQHeads, int64_t numKVHeads,
                                 int64_t headDim, int64_t valueHeadDim, int64_t pageSize,
                                 const std::string &layout, int64_t maxNumSeqs,
                                 int64_t maxNumTokens, int64_t maxBlocksPerSeq, int threads,
                                 int deviceIndex, const std::string &dtype,
                                 const std::string &kvDtype, const std::string &outDtype,
                                 bool fixedGrid) {
  BatchAttentionConfig config;
  config.numQHeads = numQHeads;
  config.numKVHeads = numKVHeads;
  config.headDim = headDim;
  config.valueHeadDim = valueHeadDim;
  config.pageSize = pageSize;
  config.layout = parseKVLayout(layout);
  config.maxNumSeqs = maxNumSeqs;
  config.maxNumTokens = maxNumTokens;
  config.maxBlocksPerSeq = maxBlocksPerSeq;
  config.threads = threads;
  config.fixedGrid = fixedGrid;
  if (deviceIndex >= 0) {
    config.device = cudaDevice(deviceIndex);
    config.dtype = parseDType(dtype);
    if (!kvDtype.empty())
      config.kvDtype = parseDType(kvDtype);
    if (!outDtype.empty())
      config.outDtype = parseDType(outDtype);
  }
  auto batch = std::make_shared<Batch>();
  batch->mods = std::move(mods);
  batch->attention = std::make_unique<BatchAttention>(batch->mods->mods, config);
  return batch;
}

void planBatch(Batch &batch, const py::handle &queryStartLoc, const py::handle &seqLens,
               const py::handle &blockTable, const py::handle &kvStart,
               const py::handle &kvEnd, const py::handle &tokenPositions,
               const py::handle &tokenBatch) {
  BorrowedTensor qsl = borrowTensor(queryStartLoc, "query_start_loc");
  BorrowedTensor lens = borrowTensor(seqLens, "seq_lens");
  BorrowedTensor table = borrowTensor(blockTable, "block_table");
  auto optional = [](const py::handle &obj, const char *name) {
    return obj.is_none() ? BorrowedTensor{} : borrowTensor(obj, name);
  };
  BorrowedTensor start = optional(kvStart, "kv_start"), end = optional(kvEnd, "kv_end");
  BorrowedTensor positions = optional(tokenPositions, "token_positions");
  BorrowedTensor batches = optional(tokenBatch, "token_batch");
  batch.attention->plan(qsl.view, lens.view, table.view, start.view, end.view, positions.view,
                        batches.view);
}

py::tuple runBatch(const Batch &batch, const py::handle &qObj, const py::handle &kObj,
                   const py::handle &vObj, const py::dict &buffers, const py::dict &params,
                   std::optional<float> scale, bool returnLse, py::object outObj,
                   py::object lseObj, const std::string &kvDtype, std::vector<float> kScale,
                   std::vector<float> vScale, uintptr_t stream, const py::handle &sinksObj) {
  const BatchAttentionConfig &config = batch.attention->config();
  std::optional<CallDevice> device;
  if (config.device.kind == DeviceKind::CUDA)
    device = CallDevice{config.device, stream};
  const CallDevice *onDevice = device ? &*device : nullptr;
  std::vector<BorrowedTensor> keep;
  Bindings bindings = makeBindings(*batch.mods, buffers, params, keep, onDevice);
  BorrowedTensor q = borrowTensor(qObj, "q", onDevice);
  BorrowedTensor k = borrowTensor(kObj, "k_cache", onDevice);
  BorrowedTensor v;
  if (!vObj.is_none())
    v = borrowTensor(vObj, "v_cache", onDevice);
  BatchRunOptions options;
  if (onDevice) {
    // The runtime allocates nothing on the device: out (and lse) are made
    // here, of q's rows and the configured dtype.
    if (q.view.rank() != 3)
      throw py::value_error("q: expected [T, Hq, D], got shape " + q.view.shapeString());
    const int64_t valueDim = config.valueHeadDim ? config.valueHeadDim : config.headDim;
    allocateDeviceOutputs(*onDevice, config.outDtype.value_or(config.dtype),
                          {q.view.size(0), config.numQHeads, valueDim}, returnLse, outObj, lseObj);
    options.stream = onDevice->cuStream();
  }
  options.scale = scale;
  options.returnLse = returnLse;
  if (!kvDtype.empty())
    options.kvDtype = parseDType(kvDtype);
  options.kScale = std::move(kScale);
  options.vScale = std::move(vScale);
  CallOutputs outputs(outObj, lseObj, onDevice);
  options.out = outputs.out.view;
  options.lse = outputs.lse.view;
  BorrowedTensor sinks;
  if (!sinksObj.is_none())
    sinks = borrowTensor(sinksObj, "sinks", onDevice);
  options.sinks = sinks.view;
  auto result = std::make_shared<AttentionResult>();
  {
    py::gil_scoped_release release;
    *result = batch.attention->run(q.view, k.view, v.view, bindings, options);
  }
  return outputs.results(result, outObj, lseObj, returnLse);
}

// The merges run where v_a (v) is: `deviceIndex` (>= 0) is its CUDA device,
// whose tensors are borrowed on `stream` and whose results are new device
// tensors written on it; -1 is the CPU.
py::tuple mergeStatePy(const py::handle &va, const py::handle &sa, const py::handle &vb,
                       const py::handle &sb, int deviceIndex, uintptr_t stream) {
  const std::optional<CallDevice> device = callDevice(deviceIndex, stream);
  const CallDevice *onDevice = device ? &*device : nullptr;
  BorrowedTensor a = borrowTensor(va, "v_a", onDevice), as = borrowTensor(sa, "s_a", onDevice);
  BorrowedTensor b = borrowTensor(vb, "v_b", onDevice), bs = borrowTensor(sb, "s_b", onDevice);
  if (onDevice) {
    if (a.view.rank() != 3)
      throw py::value_error("v_a: expected [T, H, D], got shape " + a.view.shapeString());
    Tensor v = deviceTensor(a.view.dtype(), a.view.shape(), device->device, device->cuStream());
    Tensor s = deviceTensor(DType::F32, {a.view.size(0), a.view.size(1)}, device->device,
                            device->cuStream());
    MergeStateOptions options;
    options.stream = device->cuStream();
    {
      py::gil_scoped_release release;
      mergeState(a.view, as.view, b.view, bs.view, v.view(), s.view(), options);
    }
    return py::make_tuple(v, s);
  }
  auto result = std::make_shared<AttentionResult>();
  {
    py::gil_scoped_release release;
    *result = mergeState(a.view, as.view, b.view, bs.view);
  }
  return py::make_tuple(Tensor(result->out, result), Tensor(result->lse, result));
}

void mergeStateInPlacePy(const py::handle &v, const py::handle &s, const py::handle &vOther,
                         const py::handle &sOther, int deviceIndex, uintptr_t stream) {
  const std::optional<CallDevice> device = callDevice(deviceIndex, stream);
  const CallDevice *onDevice = device ? &*device : nullptr;
  BorrowedTensor a = borrowTensor(v, "v", onDevice), as = borrowTensor(s, "s", onDevice);
  BorrowedTensor b = borrowTensor(vOther, "v_other", onDevice);
  BorrowedTensor bs = borrowTensor(sOther, "s_other", onDevice);
  MergeStateOptions options;
  if (onDevice)
    options.stream = device->cuStream();
  py::gil_scoped_release release;
  mergeStateInPlace(a.view, as.view, b.view, bs.view, options);
}

py::tuple mergeStatesPy(const py::handle &v, const py::handle &s, int deviceIndex,
                        uintptr_t stream) {
  const std::optional<CallDevice> device = callDevice(deviceIndex, stream);
  const CallDevice *onDevice = device ? &*device : nullptr;
  BorrowedTensor parts = borrowTensor(v, "v", onDevice), lses = borrowTensor(s, "s", onDevice);
  const TensorView &pv = parts.view;
  if (pv.rank() != 4)
    throw Error("v must be [T, N, H, D] but has shape " + pv.shapeString());
  const std::vector<int64_t> outShape = {pv.size(0), pv.size(2), pv.size(3)};
  const std::vector<int64_t> lseShape = {pv.size(0), pv.size(2)};
  if (onDevice) {
    Tensor out = deviceTensor(pv.dtype(), outShape, device->device, device->cuStream());
    Tensor lse = deviceTensor(DType::F32, lseShape, device->device, device->cuStream());
    MergeStateOptions options;
    options.stream = device->cuStream();
    {
      py::gil_scoped_release release;
      mergeStates(pv, lses.view, out.view(), lse.view(), options);
    }
    return py::make_tuple(out, lse);
  }
  auto result = std::make_shared<AttentionResult>();
  result->ownedOut = HostTensor(pv.dtype(), outShape);
  result->ownedLse = HostTensor(DType::F32, lseShape);
  result->out = result->ownedOut.view();
  result->lse = result->ownedLse.view();
  {
    py::gil_scoped_release release;
    mergeStates(pv, lses.view, result->out, result->lse);
  }
  return py::make_tuple(Tensor(result->out, result), Tensor(result->lse, result));
}

} // namespace

PYBIND11_MODULE(_pagedc, m) {
  m.doc() = "pagedc: paged flex attention with JIT-compiled mods (native part)";

  // pagedc::Error (every runtime input check) -> pagedc.Error(ValueError).
  py::register_exception<Error>(m, "Error", PyExc_ValueError);

  m.def("cuda_codegen_available", &jit::cudaCodeGenAvailable);

  py::class_<Tensor>(m, "Tensor",
                     "A tensor owned by pagedc (an attention output, a cache's pages); "
                     "exports DLPack: numpy.from_dlpack(t), torch.from_dlpack(t).")
      .def_static(
          "from_dlpack",
          [](py::object obj, std::optional<uintptr_t> stream) {
            // With stream=, CUDA producers are asked for their data on it.
            // The tensor may be on any device.
            CallDevice call{Device::cpu(), stream.value_or(0), /*anyDevice=*/true};
            BorrowedTensor t = borrowTensor(obj, "tensor", stream ? &call : nullptr);
            // The owner holds the producer's capsule; release it with the GIL.
            std::shared_ptr<void> owner(new py::object(t.keepAlive), [](void *p) {
              py::gil_scoped_acquire gil;
              delete static_cast<py::object *>(p);
            });
            return Tensor(t.view, owner);
          },
          py::arg("obj"), py::arg("stream") = py::none(),
          "Wraps any DLPack tensor without copying; stream= (a CUstream) is passed to a "
          "CUDA producer's __dlpack__.")
      .def_property_readonly("shape", [](const Tensor &t) { return py::tuple(py::cast(t.shape())); })
      .def_property_readonly("strides", [](const Tensor &t) { return py::tuple(py::cast(t.strides())); })
      .def_property_readonly("dtype", &Tensor::dtype)
      .def_property_readonly("device", &Tensor::device)
      .def_property_readonly("data_ptr", &Tensor::dataPtr)
      .def("__dlpack__",
           [](py::object self, py::kwargs kwargs) {
             // DLPack's handshake: stream= is the consumer's stream, which
             // a device tensor's producing work is made to precede.
             py::object stream = kwargs.contains("stream") ? py::object(kwargs["stream"])
                                                           : py::object(py::none());
             return exportDLPack(std::move(self), stream);
           })
      .def_property_readonly(
          "__array_interface__",
          [](const Tensor &t) -> py::object {
            // NumPy before 2.0 marks arrays it imports through DLPack
            // read-only, so outputs could not be written or handed back to
            // pagedc; the array interface gives NumPy a writable view of the
            // same memory. bf16 has no NumPy type: no interface.
            const TensorView &v = t.view();
            const char *typestr = nullptr;
            switch (v.dtype()) {
            case DType::F32: typestr = "<f4"; break;
            case DType::F64: typestr = "<f8"; break;
            case DType::F16: typestr = "<f2"; break;
            case DType::I32: typestr = "<i4"; break;
            case DType::I64: typestr = "<i8"; break;
            case DType::U8: typestr = "|u1"; break;
            case DType::Bool: typestr = "|b1"; break;
            // No NumPy type: bf16 and the 8-bit floats show as their bits.
            case DType::F8E4M3: typestr = "|u1"; break;
            case DType::F8E5M2: typestr = "|u1"; break;
            case DType::BF16: break;
            }
            if (!typestr || v.device().kind != DeviceKind::CPU)
              throw py::attribute_error("__array_interface__: no NumPy view of " +
                                        std::string(dtypeName(v.dtype())) + " on " +
                                        deviceName(v.device()));
            py::list strides;
            for (int64_t stride : v.strides())
              strides.append(stride * static_cast<int64_t>(dtypeSize(v.dtype())));
            py::dict interface;
            interface["version"] = 3;
            interface["shape"] = py::tuple(py::cast(v.shape()));
            interface["strides"] = py::tuple(strides);
            interface["typestr"] = typestr;
            interface["data"] = py::make_tuple(reinterpret_cast<uintptr_t>(v.data()), false);
            return interface;
          })
      .def("__dlpack_device__",
           [](const Tensor &t) {
             return py::make_tuple(t.view().device().kind == DeviceKind::CPU ? 1 : 2,
                                   t.view().device().index);
           })
      .def("__repr__", [](const Tensor &t) {
        return "pagedc.Tensor(shape=" + t.view().shapeString() + ", dtype=" + t.dtype() +
               ", device=" + t.device() + ")";
      });

  py::class_<Mods, std::shared_ptr<Mods>>(m, "Mods")
      .def(py::init<>(), "No mods: plain softmax attention.")
      .def_property_readonly("mask_name", [](const Mods &s) { return s.mods.maskName; })
      .def_property_readonly("score_name", [](const Mods &s) { return s.mods.scoreName; })
      .def_property_readonly("buffers", &bufferDecls)
      .def_property_readonly("params", &paramDecls)
      .def_property_readonly("has_cuda", [](const Mods &s) { return !s.mods.cuda.empty(); })
      .def_property_readonly("cuda_source", [](const Mods &s) { return s.mods.cuda.modCode; });

  py::class_<SourceCompileResult>(m, "CompileResult")
      .def_readonly("mods", &SourceCompileResult::mods)
      .def_readonly("diagnostics", &SourceCompileResult::diagnostics)
      .def_readonly("error", &SourceCompileResult::error);
  // The largest program any reader accepts (pagedc/ProgramFile.h); compile()
  // reads files with this bound.
  m.attr("MAX_PROGRAM_BYTES") = py::int_(kMaxProgramBytes);
  m.def("compile_source", &compileSource, py::arg("file_name"), py::arg("source"),
        py::arg("mask"), py::arg("score"), py::arg("defines"), py::arg("with_cuda"));
  m.def("list_mods", &listMods);

  py::class_<PagedKVCache, std::shared_ptr<PagedKVCache>>(m, "KVCache")
      .def(py::init(&makeCache), py::arg("n_pages"), py::arg("page_size"),
           py::arg("max_batch_size"), py::arg("heads"), py::arg("head_dim"),
           py::arg("value_head_dim"), py::arg("dtype"), py::arg("k_scale"), py::arg("v_scale"),
           py::arg("device_index") = -1)
      .def_property_readonly("k_scale", [](const PagedKVCache &c) { return c.kScale(); })
      .def_property_readonly("v_scale", [](const PagedKVCache &c) { return c.vScale(); })
      .def_property_readonly("n_pages", &PagedKVCache::numPages)
      .def_property_readonly("page_size", &PagedKVCache::pageSize)
      .def_property_readonly("max_batch_size", &PagedKVCache::maxBatch)
      .def_property_readonly("heads", &PagedKVCache::heads)
      .def_property_readonly("head_dim", &PagedKVCache::headDim)
      .def_property_readonly("value_head_dim", &PagedKVCache::valueHeadDim)
      .def_property_readonly("dtype", [](const PagedKVCache &c) { return dtypeName(c.dtype()); })
      .def_property_readonly("device", [](const PagedKVCache &c) { return deviceName(c.device()); })
      .def("reserve", &PagedKVCache::reserve, py::arg("slot"), py::arg("seq_len"))
      .def("erase", &PagedKVCache::erase, py::arg("slot"))
      .def("fork", py::overload_cast<int64_t, int64_t, int64_t>(&PagedKVCache::fork),
           py::arg("src"), py::arg("dst"), py::arg("length"))
      .def("capacity", &PagedKVCache::capacity, py::arg("slot"))
      .def_property_readonly("free_page_count", &PagedKVCache::freePageCount)
      .def_property_readonly("free_pages", [](const PagedKVCache &c) { return toList(c.freePages()); })
      .def("page_table_row", [](const PagedKVCache &c, int64_t slot) { return toList(c.pageTable(slot)); })
      .def("dense_page_table",
           [](const PagedKVCache &c, std::vector<int64_t> slots, int64_t columns) {
             std::vector<int32_t> s = int32List(slots, "slots");
             std::vector<int32_t> table = c.densePageTable(s, columns);
             int64_t cols = s.empty() ? 0 : static_cast<int64_t>(table.size() / s.size());
             return int32Tensor(table, {static_cast<int64_t>(s.size()), cols});
           })
      .def("physical_to_logical", &PagedKVCache::physicalToLogical)
      .def("page_ref_count", &PagedKVCache::pageRefCount)
      .def("assign",
           [](PagedKVCache &c, py::handle batchIdx, py::handle inputPos, py::handle k,
              py::handle v) {
             BorrowedTensor b = borrowTensor(batchIdx, "batch_idx");
             BorrowedTensor p = borrowTensor(inputPos, "input_pos");
             BorrowedTensor kk = borrowTensor(k, "k_val");
             BorrowedTensor vv = borrowTensor(v, "v_val");
             py::gil_scoped_release release;
             c.assign(b.view, p.view, kk.view, vv.view);
           })
      .def("k_cache",
           [](std::shared_ptr<PagedKVCache> c) { return Tensor(c->kCache(), c); })
      .def("v_cache",
           [](std::shared_ptr<PagedKVCache> c) { return Tensor(c->vCache(), c); });

  py::class_<BlockMask, std::shared_ptr<BlockMask>>(m, "BlockMask")
      .def_readonly("batch", &BlockMask::batch)
      .def_readonly("heads", &BlockMask::heads)
      .def_readonly("q_length", &BlockMask::qLength)
      .def_readonly("kv_length", &BlockMask::kvLength)
      .def_readonly("q_block_size", &BlockMask::qBlockSize)
      .def_readonly("kv_block_size", &BlockMask::kvBlockSize)
      .def_readonly("first_q_block", &BlockMask::firstQBlock)
      .def_readonly("num_q_blocks", &BlockMask::numQBlocks)
      .def_readonly("max_kv_blocks", &BlockMask::maxKvBlocks)
      .def_readonly("physical_indices", &BlockMask::physicalIndices)
      .def("kv_num_blocks", [](const BlockMask &b) {
        return int32Tensor(b.kvNumBlocks, {b.batch, b.heads, b.numQBlocks});
      })
      .def("kv_indices", [](const BlockMask &b) {
        return int32Tensor(b.kvIndices, {b.batch, b.heads, b.numQBlocks, b.maxKvBlocks});
      })
      .def("full_kv_num_blocks", [](const BlockMask &b) -> py::object {
        if (b.fullKvNumBlocks.empty())
          return py::none();
        return py::cast(int32Tensor(b.fullKvNumBlocks, {b.batch, b.heads, b.numQBlocks}));
      })
      .def("full_kv_indices", [](const BlockMask &b) -> py::object {
        if (b.fullKvNumBlocks.empty())
          return py::none();
        return py::cast(
            int32Tensor(b.fullKvIndices, {b.batch, b.heads, b.numQBlocks, b.maxKvBlocks}));
      })
      .def("dense_blocks", [](const BlockMask &b) {
        std::vector<uint8_t> dense = toDenseBlocks(b);
        HostTensor t(DType::U8, {b.batch, b.heads, b.numQBlocks, b.numKvBlocks()});
        std::memcpy(t.data(), dense.data(), dense.size());
        return Tensor(std::move(t));
      })
      .def("to_dense", [](const BlockMask &b, std::shared_ptr<Mods> mods, py::dict buffers,
                          py::dict params) {
        std::vector<uint8_t> dense;
        if (mods) {
          std::vector<BorrowedTensor> keep;
          Bindings bindings = makeBindings(*mods, buffers, params, keep);
          ResolvedBindings resolved = resolveBindings(mods->mods, bindings, Device::cpu());
          dense = toDense(b, &mods->mods, &resolved.context());
        } else {
          dense = toDense(b);
        }
        HostTensor t(DType::U8, {b.batch, b.heads, b.qLength, b.kvLength});
        std::memcpy(t.data(), dense.data(), dense.size());
        return Tensor(std::move(t));
      });

  m.def("create_block_mask", &createMask);
  m.def("block_mask_from_kv_blocks", &maskFromKvBlocks);

  m.def(
      "convert_logical_block_mask",
      [](const PagedKVCache &cache, const BlockMask &mask, std::vector<int64_t> batchIdx,
         std::vector<int64_t> kvLength) {
        PhysicalBlockMask physical = convertLogicalBlockMask(
            cache, mask, int32List(batchIdx, "batch_idx"), int32List(kvLength, "kv_len"));
        auto converted = std::make_shared<BlockMask>(std::move(physical.mask));
        bool pages = physical.indexSpace == PhysicalBlockMask::IndexSpace::PhysicalPages;
        int64_t rows = static_cast<int64_t>(physical.slots.size());
        return py::make_tuple(converted, pages,
                              int32Tensor(physical.pageTable, {rows, physical.pageTableStride}));
      });

  m.def("flex_attention",
        [](const py::handle &q, std::shared_ptr<PagedKVCache> cache, const py::handle &blockMask,
           const Mods &mods, const py::dict &buffers, const py::dict &params,
           std::vector<int64_t> batchIdx, std::vector<int64_t> kvLength,
           std::vector<int64_t> qOffset, std::optional<float> scale, bool returnLse, py::object out,
           py::object lse, int threads, const std::map<std::string, std::string> &kernelOptions,
           int deviceIndex, uintptr_t stream, const py::handle &sinks) {
          return attention(q, CallKeys{std::move(cache), {}, {}}, blockMask, mods, buffers,
                           params, std::move(batchIdx), std::move(kvLength), std::move(qOffset),
                           scale, returnLse, std::move(out), std::move(lse), threads,
                           kernelOptions, deviceIndex, stream, sinks);
        });
  // The same call with the host tensors it makes returned as DLPack capsules
  // (torch imports a capsule faster than it allocates a tensor itself).
  m.def("flex_attention_dlpack",
        [](const py::handle &q, std::shared_ptr<PagedKVCache> cache, const py::handle &blockMask,
           const Mods &mods, const py::dict &buffers, const py::dict &params,
           std::vector<int64_t> batchIdx, std::vector<int64_t> kvLength,
           std::vector<int64_t> qOffset, std::optional<float> scale, bool returnLse, py::object out,
           py::object lse, int threads, const std::map<std::string, std::string> &kernelOptions,
           int deviceIndex, uintptr_t stream, const py::handle &sinks, bool capsules) {
          return attention(q, CallKeys{std::move(cache), {}, {}}, blockMask, mods, buffers,
                           params, std::move(batchIdx), std::move(kvLength), std::move(qOffset),
                           scale, returnLse, std::move(out), std::move(lse), threads,
                           kernelOptions, deviceIndex, stream, sinks, capsules);
        });
  // Dense k [B, Hkv, S, D] and v on the host, read in place (no cache, no
  // copy); `capsules` as for flex_attention_dlpack.
  m.def("flex_attention_dense",
        [](const py::handle &q, const py::handle &k, const py::handle &v,
           const py::handle &blockMask, const Mods &mods, const py::dict &buffers,
           const py::dict &params, std::vector<int64_t> batchIdx, std::vector<int64_t> kvLength,
           std::vector<int64_t> qOffset, std::optional<float> scale, bool returnLse, py::object out,
           py::object lse, int threads, const std::map<std::string, std::string> &kernelOptions,
           const py::handle &sinks, bool capsules) {
          CallKeys keys{nullptr, borrowTensor(k, "k"), borrowTensor(v, "v")};
          return attention(q, keys, blockMask, mods, buffers, params, std::move(batchIdx),
                           std::move(kvLength), std::move(qOffset), scale, returnLse,
                           std::move(out), std::move(lse), threads, kernelOptions, -1, 0, sinks,
                           capsules);
        });
  py::class_<CallEntries, std::shared_ptr<CallEntries>>(m, "CallEntries")
      .def(py::init([](const std::vector<int64_t> &batchIdx, const std::vector<int64_t> &kvLength,
                       const std::vector<int64_t> &qOffset) {
             return std::make_shared<CallEntries>(CallEntries{int32List(batchIdx, "batch_idx"),
                                                              int32List(kvLength, "kv_length"),
                                                              int32List(qOffset, "q_offset")});
           }),
           py::arg("batch_idx"), py::arg("kv_length"), py::arg("q_offset"));
  // The small host call (attentionHost): a decode step's fixed cost is
  // mostly argument conversion, which this signature keeps to a minimum.
  m.def("flex_attention_host", &attentionHost, py::arg("q"), py::arg("cache"), py::arg("mods"),
        py::arg("entries"), py::arg("out"), py::arg("threads"), py::arg("capsule"));
  m.def("cuda_driver_info", &cudaDriverInfo,
        "(available, emulated, the library or why there is none); loads the driver.");
  m.def(
      "empty",
      [](std::vector<int64_t> shape, const std::string &dtype, int deviceIndex) {
        return deviceTensor(parseTensorDType(dtype), shape, cudaDevice(deviceIndex));
      },
      py::arg("shape"), py::arg("dtype"), py::arg("device_index"));
  m.def("to_device", &toDevice, py::arg("array"), py::arg("device_index"));
  m.def("to_host", &toHost, py::arg("tensor"));
  m.def("_strided_view", &stridedView, py::arg("tensor"), py::arg("step"),
        py::arg("columns") = -1,
        "Test support: every step-th element of the last dimension (of its first `columns`, "
        "-1: all), a view of the same memory.");
  py::class_<Stream, std::shared_ptr<Stream>>(m, "Stream")
      .def(py::init<int>(), py::arg("device_index"))
      .def_property_readonly("cuda_stream", &Stream::handle)
      .def_property_readonly("device", &Stream::device)
      .def("synchronize", &Stream::synchronize);
  py::class_<Graph, std::shared_ptr<Graph>>(m, "CudaGraph")
      .def(py::init<>())
      .def("capture_begin", &Graph::captureBegin, py::arg("stream"))
      .def("capture_end", &Graph::captureEnd)
      .def("replay", &Graph::replay);

  py::class_<Batch, std::shared_ptr<Batch>>(m, "BatchAttention")
      .def(py::init(&makeBatch), py::arg("mods"), py::arg("num_q_heads"), py::arg("num_kv_heads"),
           py::arg("head_dim"), py::arg("value_head_dim"), py::arg("page_size"),
           py::arg("kv_layout"), py::arg("max_num_seqs"), py::arg("max_num_tokens"),
           py::arg("max_blocks_per_seq"), py::arg("threads"), py::arg("device_index"),
           py::arg("dtype"), py::arg("kv_dtype") = "", py::arg("out_dtype") = "",
           py::arg("fixed_grid") = false)
      .def("plan", &planBatch)
      .def("run", &runBatch)
      .def("upload_scales",
           [](const Batch &b, const std::vector<float> &kScale, const std::vector<float> &vScale) {
             b.attention->uploadScales(kScale, vScale);
           })
      .def_property_readonly("num_seqs", [](const Batch &b) { return b.attention->numSeqs(); })
      .def_property_readonly("num_tokens",
                             [](const Batch &b) { return b.attention->numTokens(); })
      .def_property_readonly("planned", [](const Batch &b) { return b.attention->planned(); })
      .def("key_range",
           [](const Batch &b, int64_t sequence) {
             return py::make_tuple(b.attention->keyBegin(sequence),
                                   b.attention->keyEnd(sequence));
           })
      .def_property_readonly("plan_shape",
                             [](const Batch &b) {
                               const BatchPlanShape shape = b.attention->planShape();
                               return py::make_tuple(shape.prefillTiles, shape.decodeSequences,
                                                     shape.decodeSplits);
                             })
      .def("kernel_cache_addresses", [](const Batch &b) {
        auto [k, v] = b.attention->kernelCacheAddresses();
        return py::make_tuple(reinterpret_cast<uintptr_t>(k), reinterpret_cast<uintptr_t>(v));
      });
  m.def("merge_state", &mergeStatePy, py::arg("v_a"), py::arg("s_a"), py::arg("v_b"),
        py::arg("s_b"), py::arg("device") = -1, py::arg("stream") = 0);
  m.def("merge_state_in_place", &mergeStateInPlacePy, py::arg("v"), py::arg("s"),
        py::arg("v_other"), py::arg("s_other"), py::arg("device") = -1, py::arg("stream") = 0);
  m.def("merge_states", &mergeStatesPy, py::arg("v"), py::arg("s"), py::arg("device") = -1,
        py::arg("stream") = 0);
  m.def("_time_cpp_calls", &timeCppCalls,
        "Benchmark support: times flexAttention() in a C++ loop (ns per call).");
}
