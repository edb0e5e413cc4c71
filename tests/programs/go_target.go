// A Go program for attach tests. Sixteen goroutines block in read(2) on
// their own stacks (32 KiB each: Go allocates and moves goroutine stacks
// itself, in its heap, side by side), each holding a pattern in its locals
// that it checks after the wait, while two goroutines compute. The main
// goroutine keeps the first thread and blocks reading stdin near the low
// end of its own stack. Once stdin closes it wakes them all and prints a
// checksum that does not depend on timing (exit 1 if a pattern changed).
// Anything written below a goroutine's stack pointer, as an injected call
// would, lands on another goroutine's stack: a wrong pattern, a crash, or
// "fatal error: unknown caller pc".
//
// Built alone with `-ldflags=-linkmode=external` (no cgo of its own), or
// with go_cgo.go (cgo).
package main

import (
	"fmt"
	"os"
	"runtime"
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

// Reads stdin to its end with a large frame: the main goroutine's stack
// grows (is copied) to 32 KiB, allocated after the blockers' stacks, and
// the read waits near its low end.
//
//go:noinline
func readStdin() {
	var b [3500]uint64
	for {
		n, err := syscall.Read(0, (*[8]byte)(unsafe.Pointer(&b[len(b)-1]))[:])
		if err == syscall.EINTR || n > 0 {
			continue
		}
		break
	}
}

func main() {
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
	readStdin()
	atomic.StoreInt32(&stop, 1)
	working.Wait()
	for _, w := range writers {
		syscall.Write(w, []byte{1})
	}
	waiting.Wait()
	fmt.Printf("go_target %d blockers, %d bad, checksum %x\n", blockers, bad, sum)
	if bad != 0 {
		os.Exit(1)
	}
}
