# The CUDA backend (src/cuda/, issue 41): whether it is built, and how.
#
# KETTLE_CUDA: AUTO (the default) builds it when CMake finds nvcc (on PATH,
# in $CUDACXX, or /usr/local/cuda/bin), ON requires it, OFF leaves it out.
# Without it everything builds as before and src/cuda's C side reports
# "built without the CUDA backend". CUDA C++ is only in src/cuda/*.cu,
# compiled into kettle_cuda (a static library kettle_lib links); the
# runtime is linked statically (cudart_static), never libcuda or its stub:
# the driver is loaded at run time and its absence is an error value
# (kt_cuda_probe), so the binary runs on machines with no GPU.
# Architectures: 90 (H100) unless CMAKE_CUDA_ARCHITECTURES says otherwise.
#
# Not in the sanitizer, fault-injection and fuzz builds (forced OFF there,
# and scripts/test.sh passes -DKETTLE_CUDA=OFF to say so): ASan's shadow
# memory and the CUDA driver's address-space reservations collide, TSan
# does not know the runtime's threads, the fault build's --wrap of malloc
# and friends would reach into cudart_static's own calls, the sanitizers
# see nothing of device code anyway, and nvcc's compile would add to
# every one of those builds' time. The GPU code has no host-side state to
# check there: its C side (cuda_host.c, cuda_meta.c) is built and tested
# in those builds all the same, against cuda_none.c.
set(KETTLE_CUDA AUTO CACHE STRING "Build the CUDA backend (src/cuda): AUTO (when nvcc is found), ON, OFF")
set_property(CACHE KETTLE_CUDA PROPERTY STRINGS AUTO ON OFF)
string(TOUPPER "${KETTLE_CUDA}" KT_CUDA_MODE)
set(KT_CUDA_ENABLED OFF)
if(KT_SANITIZE OR KT_TSAN OR KT_FUZZ OR KT_FAULT)
  if(KT_CUDA_MODE STREQUAL "ON")
    message(FATAL_ERROR "KETTLE_CUDA=ON does not go with the sanitizer / fault / fuzz builds (cmake/cuda.cmake says why)")
  endif()
  message(STATUS "CUDA backend: off (sanitizer / fault / fuzz build: cmake/cuda.cmake says why)")
elseif(NOT KT_CUDA_MODE STREQUAL "OFF")
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND "$ENV{CUDACXX}" STREQUAL "")
    find_program(KT_NVCC nvcc HINTS "$ENV{CUDA_HOME}/bin" /usr/local/cuda/bin)
    if(KT_NVCC)
      set(ENV{CUDACXX} "${KT_NVCC}")
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    enable_language(CUDA)
    # programs that link kettle_cuda stay linked by the C compiler, as
    # without CUDA (CMake would otherwise link every one of them with nvcc);
    # CUDA's implicit libraries still come along, and cudart_static below
    set(CMAKE_CUDA_LINKER_PREFERENCE_PROPAGATES 0)
    find_package(CUDAToolkit REQUIRED)
    set(KT_CUDA_RUNTIME_TARGET CUDA::cudart_static)
    set(CMAKE_CUDA_RUNTIME_LIBRARY Static)
    if(NOT TARGET CUDA::cudart_static)
      if(KT_DEVICE_CHECK AND TARGET CUDA::cudart)
        # a GPU machine whose toolkit lacks the static runtime: test_cuda
        # can still run there, on the shared one it has
        message(WARNING "no libcudart_static.a beside nvcc: test_cuda links the shared CUDA runtime")
        set(KT_CUDA_RUNTIME_TARGET CUDA::cudart)
        set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
      else()
        message(FATAL_ERROR "the CUDA toolkit at ${CUDAToolkit_LIBRARY_DIR} has no libcudart_static.a, which kettle "
                            "links (never the driver): install the toolkit's static runtime, or -DKETTLE_CUDA=OFF")
      endif()
    endif()
    set(KT_CUDA_ENABLED ON)
    message(STATUS "CUDA backend: on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES})")
  elseif(KT_CUDA_MODE STREQUAL "ON")
    message(FATAL_ERROR "KETTLE_CUDA=ON but no CUDA compiler was found: install the CUDA toolkit, or point "
                        "CMAKE_CUDA_COMPILER (or $CUDACXX) at nvcc")
  else()
    message(STATUS "CUDA backend: off (no nvcc found; -DKETTLE_CUDA=ON to require it)")
  endif()
endif()

# kt_cuda_backend(LIB): the .cu kernels as kettle_cuda, linked by LIB, and
# LIB's KT_HAVE_CUDA / KT_CUDA_ARCHS / KT_CUDA_ARCH_MIN (the probe's "this
# build has code for" check; 0 for native / all, left to the runtime).
function(kt_cuda_backend lib)
  if(NOT KT_CUDA_ENABLED)
    return()
  endif()
  file(GLOB KT_CU_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/cuda/*.cu)
  add_library(kettle_cuda STATIC ${KT_CU_SOURCES})
  target_include_directories(kettle_cuda PRIVATE ${CMAKE_SOURCE_DIR}/include ${CMAKE_SOURCE_DIR}/src)
  set(flags -Xcompiler=-Wall,-Wextra)
  if(KT_WERROR)
    list(APPEND flags --Werror=all-warnings)
  endif()
  target_compile_options(kettle_cuda PRIVATE ${flags})
  target_link_libraries(kettle_cuda PUBLIC ${KT_CUDA_RUNTIME_TARGET})
  set(min 0)
  foreach(a ${CMAKE_CUDA_ARCHITECTURES})
    string(REGEX MATCH "^[0-9]+" n "${a}")
    if(n AND (min EQUAL 0 OR n LESS min))
      set(min ${n})
    endif()
  endforeach()
  string(REPLACE ";" "," archs "${CMAKE_CUDA_ARCHITECTURES}")
  target_compile_definitions(${lib} PUBLIC KT_HAVE_CUDA=1 KT_CUDA_ARCHS="${archs}" KT_CUDA_ARCH_MIN=${min})
  target_link_libraries(${lib} PUBLIC kettle_cuda)
endfunction()
