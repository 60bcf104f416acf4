// The scalar build of the kernels (flags in CMakeLists.txt).
#define SIMSEARCH_NS scalar
#include "kernels_impl.h"
