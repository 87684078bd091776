// A user's own nn/module.h, first on the consumer's include path. accrue's headers
// must never reach it (Note [Include paths] in accrue's CMakeLists.txt): they
// include their own as "accrue/nn/module.h".
#error "the consumer's own nn/module.h was included in place of accrue's"
