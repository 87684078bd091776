#include "kernels/backend.h"
