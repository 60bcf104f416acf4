// The avx2 build of the kernels (flags in CMakeLists.txt).
#define SIMSEARCH_NS avx2
#include "kernels_impl.h"
