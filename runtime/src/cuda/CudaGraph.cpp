//===- CudaGraph.cpp - Stream capture and CUDA graphs ---------------------===//

#include "cuda/CudaGraph.h"

#include "pagedc/Error.h"

#include <fmt/format.h>

#include <utility>

namespace pagedc {

bool cudaGraphsAvailable(const CudaDriver &driver) {
  return driver.api().streamBeginCapture != nullptr;
}

int streamCaptureStatus(const CudaDriver &driver, cu::Stream stream) {
  if (!cudaGraphsAvailable(driver))
    return cu::kStreamCaptureStatusNone;
  int status = cu::kStreamCaptureStatusNone;
  driver.check(driver.api().streamIsCapturing(stream, &status), "cuStreamIsCapturing");
  return status;
}

CudaGraphExec::CudaGraphExec(CudaGraphExec &&other) noexcept
    : driver_(other.driver_), exec_(std::exchange(other.exec_, nullptr)) {}

CudaGraphExec &CudaGraphExec::operator=(CudaGraphExec &&other) noexcept {
  if (this != &other) {
    if (exec_)
      driver_->api().graphExecDestroy(exec_);
    driver_ = other.driver_;
    exec_ = std::exchange(other.exec_, nullptr);
  }
  return *this;
}

CudaGraphExec::~CudaGraphExec() {
  if (exec_)
    driver_->api().graphExecDestroy(exec_);
}

void CudaGraphExec::launch(cu::Stream stream) const {
  if (!exec_)
    throw Error("CudaGraphExec::launch: no graph (default-constructed or moved from)");
  driver_->check(driver_->api().graphLaunch(exec_, stream), "cuGraphLaunch");
}

CudaStreamCapture::CudaStreamCapture(const CudaDriver &driver, cu::Stream stream, int mode)
    : driver_(driver), stream_(stream) {
  if (!cudaGraphsAvailable(driver))
    throw Error(fmt::format("the CUDA driver {} has no stream capture (cuStreamBeginCapture_v2 "
                            "and the graph entry points)",
                            driver.libraryPath()));
  driver.check(driver.api().streamBeginCapture(stream, mode), "cuStreamBeginCapture");
  capturing_ = true;
}

CudaStreamCapture::~CudaStreamCapture() {
  if (!capturing_)
    return;
  cu::Graph graph = nullptr;
  if (driver_.api().streamEndCapture(stream_, &graph) == 0 && graph)
    driver_.api().graphDestroy(graph);
}

CudaGraphExec CudaStreamCapture::end() {
  if (!capturing_)
    throw Error("CudaStreamCapture::end: the capture has ended already");
  capturing_ = false;
  cu::Graph graph = nullptr;
  driver_.check(driver_.api().streamEndCapture(stream_, &graph), "cuStreamEndCapture");
  cu::GraphExec exec = nullptr;
  const cu::Result status = driver_.api().graphInstantiate(&exec, graph, 0);
  // The instantiation is independent of the graph.
  driver_.api().graphDestroy(graph);
  driver_.check(status, "cuGraphInstantiate");
  return CudaGraphExec(driver_, exec);
}

CudaGraphExec captureGraph(const CudaDriver &driver, cu::Stream stream,
                           const std::function<void()> &work, int mode) {
  CudaStreamCapture capture(driver, stream, mode);
  work();
  return capture.end();
}

} // namespace pagedc
