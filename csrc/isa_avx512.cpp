// The avx512 build of the kernels (flags in CMakeLists.txt).
#define SIMSEARCH_NS avx512
#include "kernels_impl.h"
