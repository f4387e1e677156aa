# Sourced by the GPU scripts: where cuDNN's headers and library are, for attention_cudnn.cuh (the Makefile's
# CUDNN_INCLUDE, the loader's LD_LIBRARY_PATH). The CUDA toolkit's copy first, else the one PyTorch's pip package
# (nvidia-cudnn-cu13) brings; prints what it found.
if [ -z "${CUDNN_INCLUDE:-}" ] && [ ! -f "${CUDA_HOME:-/usr/local/cuda}/include/cudnn_graph.h" ] && \
   [ ! -f /usr/include/cudnn_graph.h ] && [ ! -f /usr/include/x86_64-linux-gnu/cudnn_graph.h ]; then
    _cudnn_dir=$(python3 -c "import nvidia.cudnn as m; print(list(m.__path__)[0])" 2>/dev/null || true)
    if [ -n "$_cudnn_dir" ] && [ -f "$_cudnn_dir/include/cudnn_graph.h" ]; then
        export CUDNN_INCLUDE="$_cudnn_dir/include"
        export LD_LIBRARY_PATH="$_cudnn_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
fi
_cudnn_lib=$(ldconfig -p 2>/dev/null | grep -m1 'libcudnn.so.9' || true)
echo "cuDNN headers: ${CUDNN_INCLUDE:-in the CUDA toolkit or none}; library: ${_cudnn_lib:-on LD_LIBRARY_PATH or none}"
