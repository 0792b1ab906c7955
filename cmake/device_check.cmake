# KT_DEVICE_CHECK: the build scripts/gpu_check.sh makes on a lent GPU
# machine, which has nvcc, CMake and a C compiler but none of the Debian
# dev packages the full build needs (jansson, pcre2, xxhash, png, jpeg,
# webp, microhttpd, curl, nettle, cmocka: scripts/deps.sh) and no network
# to install them. test_cuda needs none of them: it links the CUDA
# backend, src/cuda's C side, and the CPU references it is checked against
# (src/ops, the KV pool, src/base but json_safe.c), which use only libc,
# libm and pthreads. Nothing else is built.
if(NOT KT_CUDA_ENABLED)
  message(FATAL_ERROR "KT_DEVICE_CHECK needs the CUDA backend, and no nvcc was found (or KETTLE_CUDA=OFF)")
endif()
file(GLOB KT_CORE_SOURCES CONFIGURE_DEPENDS src/base/*.c src/ops/*.c src/cuda/*.c)
list(REMOVE_ITEM KT_CORE_SOURCES ${CMAKE_SOURCE_DIR}/src/base/json_safe.c)
list(APPEND KT_CORE_SOURCES src/kv/block_pool.c src/kv/state_pool.c)
add_library(kettle_lib STATIC ${KT_CORE_SOURCES})
target_include_directories(kettle_lib PUBLIC include src)
target_link_libraries(kettle_lib PUBLIC Threads::Threads m ${CMAKE_DL_LIBS})
file(GLOB KT_AVX2_SOURCES CONFIGURE_DEPENDS src/ops/*_avx2.c)
set_source_files_properties(${KT_AVX2_SOURCES} PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma;-mf16c")
kt_cuda_backend(kettle_lib)
enable_testing()
add_executable(test_cuda tests/test_cuda.c)
target_link_libraries(test_cuda PRIVATE kettle_lib)
add_test(NAME test_cuda COMMAND test_cuda)
set_tests_properties(test_cuda PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
