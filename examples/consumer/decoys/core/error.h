// A user's own core/error.h, first on the consumer's include path. accrue's headers
// must never reach it (Note [Include paths] in accrue's CMakeLists.txt): they
// include their own as "accrue/core/error.h".
#error "the consumer's own core/error.h was included in place of accrue's"
