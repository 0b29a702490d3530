//===- CudaGraph.h - Stream capture and CUDA graphs ------------*- C++ -*-===//
//
// A decode step is a few short launches; captured once into a graph and
// launched as one, it costs one launch of CPU time per step. Internal to the
// runtime (BatchAttention's CUDA path, tests): capture what a call puts on
// a stream, instantiate it once, launch it each step. A graph reads device
// memory when it runs, so each step uploads its inputs into the buffers the
// capture saw, before the launch.
//
// The captured work must not upload from host memory, allocate, free, load
// modules or synchronize: the driver refuses such a call (the emulated one
// also prints which) and invalidates the capture, and end() throws with the
// reason.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_RUNTIME_CUDAGRAPH_H
#define PAGEDC_RUNTIME_CUDAGRAPH_H

#include "pagedc/CudaDriver.h"

#include <functional>

namespace pagedc {

/// Whether the driver has stream capture and graphs (CUDA 10 and later).
bool cudaGraphsAvailable(const CudaDriver &driver);

/// cu::kStreamCaptureStatus*: whether `stream` is capturing.
int streamCaptureStatus(const CudaDriver &driver, cu::Stream stream);

/// An instantiated graph (CUgraphExec), launched as often as needed.
class CudaGraphExec {
public:
  CudaGraphExec() = default;
  CudaGraphExec(CudaGraphExec &&other) noexcept;
  CudaGraphExec &operator=(CudaGraphExec &&other) noexcept;
  CudaGraphExec(const CudaGraphExec &) = delete;
  CudaGraphExec &operator=(const CudaGraphExec &) = delete;
  ~CudaGraphExec();

  /// Runs the captured work on `stream`, in capture order; throws
  /// pagedc::Error when the driver reports a failure.
  void launch(cu::Stream stream) const;
  explicit operator bool() const { return exec_ != nullptr; }

private:
  friend class CudaStreamCapture;
  CudaGraphExec(const CudaDriver &driver, cu::GraphExec exec) : driver_(&driver), exec_(exec) {}
  const CudaDriver *driver_ = nullptr;
  cu::GraphExec exec_ = nullptr;
};

/// A capture of a stream, from construction to end(). Destroyed before
/// end() (the captured work threw), it ends the capture and discards what
/// was recorded, so the stream runs work again.
class CudaStreamCapture {
public:
  /// Begins the capture; throws pagedc::Error when the driver has no
  /// graphs or refuses (the legacy stream, a stream already capturing).
  CudaStreamCapture(const CudaDriver &driver, cu::Stream stream,
                    int mode = cu::kStreamCaptureModeGlobal);
  CudaStreamCapture(const CudaStreamCapture &) = delete;
  CudaStreamCapture &operator=(const CudaStreamCapture &) = delete;
  ~CudaStreamCapture();

  /// Ends the capture and instantiates its graph. Throws pagedc::Error,
  /// with the driver's description, when a forbidden call invalidated it.
  CudaGraphExec end();

private:
  const CudaDriver &driver_;
  cu::Stream stream_;
  bool capturing_ = false;
};

/// Captures what `work` puts on `stream` and instantiates it.
CudaGraphExec captureGraph(const CudaDriver &driver, cu::Stream stream,
                           const std::function<void()> &work,
                           int mode = cu::kStreamCaptureModeGlobal);

} // namespace pagedc

#endif // PAGEDC_RUNTIME_CUDAGRAPH_H
