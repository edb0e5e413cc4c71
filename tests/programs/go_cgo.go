package main

// Built with go_target.go, this links the program with cgo: the runtime's
// threads are then the C library's (`pthread_create`), as in any Go
// program that calls C.

// static int twice(int x) { return 2 * x; }
import "C"

var _ = C.twice(1)
