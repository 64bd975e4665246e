// Package fencekeeper is fencing for storage engines in Go, through cgo and
// libfencekeeper_capi (host/capi): a thin layer that converts values and turns the
// C statuses into errors. The decisions, the checks of every verdict and the stores
// are the library's.
//
//	guard, err := fencekeeper.Open(fencekeeper.Options{StorePath: "marks.redb"})
//	token := "34"
//	outcome, err := guard.Admit("orders/2026-11.csv", &token)
//	if !outcome.Admitted { log.Print(outcome.Reason) }
//
// It links against libfencekeeper_capi.so in ../lib, where the release's C library
// tarball has it beside this module (libfencekeeper_capi-VERSION-ARCH-linux/go), else
// in the checkout's target/release (cargo build --release -p fencekeeper-capi); the
// header is ../include in both. A Guard may be used from many goroutines at once.
package fencekeeper

/*
#cgo CFLAGS: -I${SRCDIR}/../include
#cgo LDFLAGS: -L${SRCDIR}/../lib -L${SRCDIR}/../../../target/release -lfencekeeper_capi
#cgo LDFLAGS: -Wl,-rpath,${SRCDIR}/../lib -Wl,-rpath,${SRCDIR}/../../../target/release
#include <stdlib.h>
#include "fencekeeper_capi.h"

fencekeeper_mark_store fencekeeper_go_table(uintptr_t handle);
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime/cgo"
	"unsafe"
)

// Error is a failed call: Status is the FENCEKEEPER_ERR_* value.
type Error struct {
	Status  int
	Message string
}

func (e *Error) Error() string { return e.Message }

func lastError(status C.fencekeeper_status) error {
	return &Error{Status: int(status), Message: C.GoString(C.fencekeeper_last_error())}
}

// Options open a guard; the zero value is the bundled validator, correctness mode,
// marks in memory. StorePath selects the durable file store.
type Options struct {
	Guest      string // a validator component file; "" is the bundled one
	Efficiency bool
	Strict     bool
	StorePath  string
	AuditPath  string
	HostName   string
}

// Guard is an open guard.
type Guard struct{ handle *C.fencekeeper_guard }

// Outcome is what an admit decided.
type Outcome struct {
	Class      string // admitted, stale, replayed, malformed, missing, undecided, unverified
	Admitted   bool
	Advanced   bool
	FailedOpen bool
	Breach     bool
	HTTPStatus int
	Mark       string // the admitted token, or the mark a stale token lost to
	Reason     string
}

var classes = []string{"admitted", "stale", "replayed", "malformed", "missing", "undecided", "unverified"}

// Open opens a guard.
func Open(o Options) (*Guard, error) {
	var options C.fencekeeper_options
	var owned []*C.char
	text := func(s string) *C.char {
		if s == "" {
			return nil
		}
		c := C.CString(s)
		owned = append(owned, c)
		return c
	}
	defer func() {
		for _, c := range owned {
			C.free(unsafe.Pointer(c))
		}
	}()
	options.guest_path = text(o.Guest)
	if o.Efficiency {
		options.mode = C.FENCEKEEPER_MODE_EFFICIENCY
	}
	if o.Strict {
		options.strict = 1
	}
	if o.StorePath != "" {
		options.store = C.FENCEKEEPER_STORE_KIND_FILE
		options.store_path = text(o.StorePath)
	}
	options.audit_path = text(o.AuditPath)
	options.host_name = text(o.HostName)
	var handle *C.fencekeeper_guard
	if status := C.fencekeeper_guard_open(&options, &handle); status != C.FENCEKEEPER_OK {
		return nil, lastError(status)
	}
	return &Guard{handle: handle}, nil
}

// Close frees the guard; no other call may run on it meanwhile.
func (g *Guard) Close() {
	C.fencekeeper_guard_close(g.handle)
	g.handle = nil
}

// MarkStore is your own storage for AdmitIn: values are opaque bytes (the mark's
// checked record) kept per resource key, inside your transaction.
type MarkStore interface {
	Get(resource []byte) (value []byte, found bool, err error)
	CompareAndSwap(resource, expected, value []byte) (swapped bool, err error) // expected nil: no mark
	Audit(line string) error
}

// bytesOf copies s into C memory (never NULL, even when empty: an empty token is a
// token, not a missing one); free it with C.free.
func bytesOf(s string) (*C.uint8_t, C.size_t) {
	p := C.malloc(C.size_t(len(s) + 1))
	copy(unsafe.Slice((*byte)(p), len(s)+1), s)
	return (*C.uint8_t)(p), C.size_t(len(s))
}

func outcomeOf(o *C.fencekeeper_outcome) Outcome {
	class := fmt.Sprintf("class %d", int(o.class_))
	if int(o.class_) >= 0 && int(o.class_) < len(classes) {
		class = classes[o.class_]
	}
	return Outcome{
		Class: class, Admitted: bool(o.admitted), Advanced: bool(o.advanced), FailedOpen: bool(o.failed_open),
		Breach: bool(o.breach), HTTPStatus: int(o.http_status),
		Mark:   C.GoStringN(&o.mark[0], C.int(o.mark_len)),
		Reason: C.GoStringN(&o.reason[0], C.int(o.reason_len)),
	}
}

func (g *Guard) admit(resource string, token *string, call func(r *C.uint8_t, rl C.size_t, t *C.uint8_t, tl C.size_t, o *C.fencekeeper_outcome) C.fencekeeper_status) (Outcome, error) {
	if g.handle == nil {
		return Outcome{}, &Error{Status: int(C.FENCEKEEPER_ERR_ARGUMENT), Message: "the guard is closed"}
	}
	r, rl := bytesOf(resource)
	defer C.free(unsafe.Pointer(r))
	var t *C.uint8_t
	var tl C.size_t
	if token != nil {
		t, tl = bytesOf(*token)
		defer C.free(unsafe.Pointer(t))
	}
	var o C.fencekeeper_outcome
	status := call(r, rl, t, tl, &o)
	if status != C.FENCEKEEPER_OK && status != C.FENCEKEEPER_ERR_AUDIT {
		return Outcome{}, lastError(status)
	}
	if status == C.FENCEKEEPER_ERR_AUDIT {
		return outcomeOf(&o), lastError(status)
	}
	return outcomeOf(&o), nil
}

// Admit decides on a write of resource carrying token (nil: it carried none) and
// advances the mark in the guard's store when admitted above it.
func (g *Guard) Admit(resource string, token *string) (Outcome, error) {
	return g.admit(resource, token, func(r *C.uint8_t, rl C.size_t, t *C.uint8_t, tl C.size_t, o *C.fencekeeper_outcome) C.fencekeeper_status {
		return C.fencekeeper_admit(g.handle, r, rl, t, tl, o)
	})
}

// AdmitIn is Admit against your own store, inside whatever transaction it has open.
func (g *Guard) AdmitIn(store MarkStore, resource string, token *string) (Outcome, error) {
	handle := cgo.NewHandle(store)
	defer handle.Delete()
	table := C.fencekeeper_go_table(C.uintptr_t(handle))
	return g.admit(resource, token, func(r *C.uint8_t, rl C.size_t, t *C.uint8_t, tl C.size_t, o *C.fencekeeper_outcome) C.fencekeeper_status {
		return C.fencekeeper_admit_in(g.handle, &table, r, rl, t, tl, o)
	})
}

// Mark is the resource's mark in the guard's store ("" and false: none).
func (g *Guard) Mark(resource string) (string, bool, error) {
	r, rl := bytesOf(resource)
	defer C.free(unsafe.Pointer(r))
	var mark [C.FENCEKEEPER_TOKEN_CAP]C.char
	var found C.bool
	if status := C.fencekeeper_mark(g.handle, r, rl, &mark[0], &found); status != C.FENCEKEEPER_OK {
		return "", false, lastError(status)
	}
	return C.GoString(&mark[0]), bool(found), nil
}

func storeOf(ctx unsafe.Pointer) MarkStore {
	return cgo.Handle(uintptr(ctx)).Value().(MarkStore)
}

func why(buffer *C.char, capacity C.size_t, err error) C.fencekeeper_store_status {
	text := err.Error()
	if len(text) >= int(capacity) {
		text = text[:capacity-1]
	}
	out := unsafe.Slice((*byte)(unsafe.Pointer(buffer)), int(capacity))
	n := copy(out, text)
	out[n] = 0
	return C.FENCEKEEPER_STORE_FAILED
}

//export fencekeeperGoGet
func fencekeeperGoGet(ctx unsafe.Pointer, resource *C.uint8_t, resourceLen C.size_t, value *C.uint8_t, valueLen *C.size_t, whyBuf *C.char, whyCap C.size_t) C.fencekeeper_store_status {
	stored, found, err := storeOf(ctx).Get(C.GoBytes(unsafe.Pointer(resource), C.int(resourceLen)))
	if err != nil {
		return why(whyBuf, whyCap, err)
	}
	if !found {
		return C.FENCEKEEPER_STORE_ABSENT
	}
	if len(stored) > int(*valueLen) {
		return why(whyBuf, whyCap, errors.New("a stored value longer than any mark's"))
	}
	copy(unsafe.Slice((*byte)(unsafe.Pointer(value)), int(*valueLen)), stored)
	*valueLen = C.size_t(len(stored))
	return C.FENCEKEEPER_STORE_FOUND
}

//export fencekeeperGoSwap
func fencekeeperGoSwap(ctx unsafe.Pointer, resource *C.uint8_t, resourceLen C.size_t, expected *C.uint8_t, expectedLen C.size_t, value *C.uint8_t, valueLen C.size_t, whyBuf *C.char, whyCap C.size_t) C.fencekeeper_store_status {
	var old []byte
	if expected != nil {
		old = C.GoBytes(unsafe.Pointer(expected), C.int(expectedLen))
	}
	swapped, err := storeOf(ctx).CompareAndSwap(
		C.GoBytes(unsafe.Pointer(resource), C.int(resourceLen)), old, C.GoBytes(unsafe.Pointer(value), C.int(valueLen)))
	if err != nil {
		return why(whyBuf, whyCap, err)
	}
	if swapped {
		return C.FENCEKEEPER_STORE_SWAPPED
	}
	return C.FENCEKEEPER_STORE_CONFLICT
}

//export fencekeeperGoAudit
func fencekeeperGoAudit(ctx unsafe.Pointer, line *C.char, lineLen C.size_t, whyBuf *C.char, whyCap C.size_t) C.fencekeeper_store_status {
	if err := storeOf(ctx).Audit(C.GoStringN(line, C.int(lineLen))); err != nil {
		return why(whyBuf, whyCap, err)
	}
	return C.FENCEKEEPER_STORE_WRITTEN
}
