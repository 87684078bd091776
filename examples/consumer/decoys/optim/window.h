// A user's own optim/window.h, first on the consumer's include path. accrue's headers
// must never reach it (Note [Include paths] in accrue's CMakeLists.txt): they
// include their own as "accrue/optim/window.h".
#error "the consumer's own optim/window.h was included in place of accrue's"
