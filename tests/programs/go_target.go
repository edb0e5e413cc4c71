// A Go program for attach tests. Sixteen goroutines block in read(2) on
// their own stacks (Go allocates and moves goroutine stacks itself, in its
// heap, side by side), each holding a pattern in its locals that it checks
// after the wait, while two goroutines compute. The main goroutine keeps
// the process's first thread and blocks reading stdin, with a canary
// below its stack pointer. Once stdin closes it wakes them all and prints
// a checksum that does not depend on timing and how many canary bytes
// changed (exit 1 if a pattern or the canary changed). A call injected
// on a thread blocked on a goroutine's stack writes below its stack
// pointer: over the canary, or over other goroutines' stacks (a wrong
// pattern, a crash, "fatal error: unknown caller pc").
//
// Built alone with `-ldflags=-linkmode=external` (no cgo of its own), or
// with go_cgo.go (cgo).
package main

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"
)

const blockers = 16

//go:noinline
func blocked(fd int, seed uint64, bad *int32, sum *uint64, wg *sync.WaitGroup) {
	defer wg.Done()
	var pad [3000]uint64
	for i := range pad {
		pad[i] = seed * uint64(i+1)
	}
	var b [1]byte
	for {
		n, err := syscall.Read(fd, b[:])
		if err == syscall.EINTR {
			continue
		}
		if n != 1 || err != nil {
			atomic.AddInt32(bad, 1)
		}
		break
	}
	var s uint64
	for i := range pad {
		if pad[i] != seed*uint64(i+1) {
			atomic.AddInt32(bad, 1)
		}
		s += pad[i]
	}
	atomic.AddUint64(sum, s)
}

//go:noinline
func deep(n int) uint64 {
	var pad [32]uint64
	pad[n%32] = uint64(n)
	if n == 0 {
		return pad[0]
	}
	return deep(n-1) + pad[n%32]
}

func work(seed uint64, stop *int32, wg *sync.WaitGroup) {
	defer wg.Done()
	buf := make([]uint64, 2048)
	x := seed
	for atomic.LoadInt32(stop) == 0 {
		for i := range buf {
			x = x*6364136223846793005 + 1442695040888963407
			buf[i] = x
		}
		buf[0] += deep(40)
	}
}

// The main goroutine keeps the process's first thread, so its blocking read
// of stdin is on that thread, on the goroutine's own stack.
func init() {
	runtime.LockOSThread()
}

// The stack the main goroutine waits on: grown to 64 KiB before the wait
// (Go never shrinks a stack but at a garbage collection, which is off).
//
//go:noinline
func grow() uint64 {
	var big [6000]uint64
	for i := range big {
		big[i] = uint64(i)
	}
	return big[len(big)-1]
}

// Reads stdin to its end on the process's first thread, with a canary
// below the goroutine's stack pointer: from 4 to 24 KiB below it, where
// nothing of the program's goes while it waits (the calls down to the
// system call use less than 1 KiB, and signal handlers run on the
// thread's signal stack), but where a call injected on that thread would
// write. Returns how many of its bytes changed.
//
//go:noinline
func readStdin() int {
	var here byte
	sp := uintptr(unsafe.Pointer(&here))
	canary := unsafe.Slice((*byte)(unsafe.Pointer(sp-24<<10)), 20<<10)
	for i := range canary {
		canary[i] = byte(0xa5 ^ i)
	}
	var b [64]byte
	for {
		n, err := syscall.Read(0, b[:])
		if err == syscall.EINTR || n > 0 {
			continue
		}
		break
	}
	changed := 0
	for i := range canary {
		if canary[i] != byte(0xa5^i) {
			changed++
		}
	}
	return changed
}

func main() {
	debug.SetGCPercent(-1)
	var bad, stop int32
	var sum uint64
	var waiting, working sync.WaitGroup
	var writers []int
	for i := 0; i < blockers; i++ {
		var p [2]int
		if err := syscall.Pipe(p[:]); err != nil {
			panic(err)
		}
		writers = append(writers, p[1])
		waiting.Add(1)
		go blocked(p[0], uint64(i+1)*0x9e3779b97f4a7c15, &bad, &sum, &waiting)
	}
	for i := 0; i < 2; i++ {
		working.Add(1)
		go work(uint64(i+1), &stop, &working)
	}
	grow()
	changed := readStdin()
	atomic.StoreInt32(&stop, 1)
	working.Wait()
	for _, w := range writers {
		syscall.Write(w, []byte{1})
	}
	waiting.Wait()
	fmt.Printf("go_target %d blockers, %d bad, checksum %x, %d bytes changed below the main goroutine's stack pointer\n", blockers, bad, sum, changed)
	if bad != 0 || changed != 0 {
		os.Exit(1)
	}
}
