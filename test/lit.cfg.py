# Lit configuration for pagedc's compiler, CLI and runtime tests.
import glob
import os
import subprocess

import lit.formats

config.name = "pagedc"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".attn", ".mlir", ".test"]
config.excludes = ["Inputs", "lit.local.cfg", "CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.pagedc_obj_root, "test")

# Our tools first, then FileCheck / not / split-file from LLVM.
path = os.path.pathsep.join([config.pagedc_tools_dir, config.llvm_tools_dir,
                             config.environment.get("PATH", os.environ.get("PATH", ""))])
config.environment["PATH"] = path
# Keep the kernel cache of the tests away from the user's.
config.environment["PAGEDC_CACHE_DIR"] = os.path.join(config.test_exec_root, "kernel-cache")
config.environment["HOME"] = os.environ.get("HOME", "/tmp")

config.substitutions.append(("%examples", os.path.join(config.pagedc_src_root, "examples")))
config.substitutions.append(("%python", config.python_executable))
config.substitutions.append(("%templates", os.path.join(config.pagedc_src_root, "templates")))
# The Python package (build/python) and the interpreter it was built for,
# which has NumPy; both empty when the tree has no package.
module_dir = os.path.join(config.pagedc_obj_root, "python")
module_python = getattr(config, "pagedc_module_python", "")
if not (module_python and os.path.isdir(os.path.join(module_dir, "pagedc"))):
    module_python, module_dir = "", ""
config.substitutions.append(("%module_python", '"%s"' % module_python))
config.substitutions.append(("%module_dir", '"%s"' % module_dir))
if module_python:
    config.available_features.add("pagedc-python")

if config.have_nvrtc:
    config.available_features.add("nvrtc")
    # nvJitLink (kernels with linked mods) ships beside NVRTC from CUDA 12.
    if glob.glob(os.path.join(config.cuda_toolkit_root, "lib*", "libnvJitLink.so*")):
        config.available_features.add("nvjitlink")

# Tools not every tree builds (the sanitized tree builds a few).
for tool in ("pagedc-gpu",):
    if os.path.exists(os.path.join(config.pagedc_tools_dir, tool)):
        config.available_features.add(tool)

# A usable GPU: pagedc-device-query exits 0 and prints "cuda:N ..." lines only
# when the driver loads and reports a device.
def has_cuda_gpu():
    tool = os.path.join(config.pagedc_tools_dir, "pagedc-device-query")
    if not os.path.exists(tool):
        return False
    try:
        result = subprocess.run([tool], capture_output=True, text=True, timeout=60)
    except Exception:
        return False
    return result.returncode == 0 and "cuda:" in result.stdout

if has_cuda_gpu():
    config.available_features.add("cuda-gpu")
