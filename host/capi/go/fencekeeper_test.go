package fencekeeper

import (
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

func tok(s string) *string { return &s }

func TestThePausedHolderIsRefusedAndTheFileStoreRemembers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "marks.redb")
	g, err := Open(Options{StorePath: path})
	if err != nil {
		t.Fatal(err)
	}
	for _, token := range []string{"33", "34"} {
		if o, err := g.Admit("orders/2026-11.csv", tok(token)); err != nil || !o.Advanced {
			t.Fatalf("%s: %+v %v", token, o, err)
		}
	}
	late, err := g.Admit("orders/2026-11.csv", tok("33"))
	if err != nil || late.Admitted || late.Class != "stale" || late.HTTPStatus != 409 || late.Mark != "34" {
		t.Fatalf("late: %+v %v", late, err)
	}
	g.Close()
	g, err = Open(Options{StorePath: path})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if mark, found, err := g.Mark("orders/2026-11.csv"); err != nil || !found || mark != "34" {
		t.Fatalf("mark after reopening: %q %v %v", mark, found, err)
	}
}

func TestMissingAndMalformedTokensAndBadOptions(t *testing.T) {
	g, err := Open(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if o, _ := g.Admit("r", nil); o.Class != "missing" || o.HTTPStatus != 428 {
		t.Fatalf("missing: %+v", o)
	}
	for _, bad := range []string{"", "-1", "3 4", "1.2.3.4.5", strings.Repeat("0", 200)} {
		if o, _ := g.Admit("r", tok(bad)); o.Class != "malformed" || o.Admitted {
			t.Fatalf("%q: %+v", bad, o)
		}
	}
	if o, _ := g.Admit("/\xff\xfe", tok("1")); o.Class != "malformed" {
		t.Fatalf("a key that is not UTF-8: %+v", o)
	}
	_, err = Open(Options{Guest: "/nonexistent.wasm"})
	var e *Error
	if !errors.As(err, &e) || e.Status != 2 || !strings.Contains(e.Message, "cannot load the validator") {
		t.Fatalf("a guest that is not there: %v", err)
	}
}

// An engine's transaction: a map it commits or drops.
type txn struct {
	marks map[string][]byte
	audit []string
	fail  bool
}

func (x *txn) Get(r []byte) ([]byte, bool, error) {
	if x.fail {
		return nil, false, errors.New("the disk is gone")
	}
	v, ok := x.marks[string(r)]
	return v, ok, nil
}

func (x *txn) CompareAndSwap(r, expected, value []byte) (bool, error) {
	current, ok := x.marks[string(r)]
	if ok != (expected != nil) || (ok && string(current) != string(expected)) {
		return false, nil
	}
	x.marks[string(r)] = value
	return true, nil
}

func (x *txn) Audit(line string) error { x.audit = append(x.audit, line); return nil }

func TestAGoEngineKeepsMarksInItsOwnTransaction(t *testing.T) {
	g, err := Open(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	x := &txn{marks: map[string][]byte{}}
	for _, token := range []string{"33", "34"} {
		if o, err := g.AdmitIn(x, "invoice/7", tok(token)); err != nil || !o.Advanced {
			t.Fatalf("%s: %+v %v", token, o, err)
		}
	}
	if o, _ := g.AdmitIn(x, "invoice/7", tok("33")); o.Class != "stale" || o.Mark != "34" {
		t.Fatalf("stale: %+v", o)
	}
	if !strings.HasPrefix(string(x.marks["invoice/7"]), "fk2 34 ") || len(x.audit) != 2 {
		t.Fatalf("record %q, audit %q", x.marks["invoice/7"], x.audit)
	}
	if !strings.Contains(x.audit[1], `"store":"the Go engine's store"`) {
		t.Fatalf("audit: %s", x.audit[1])
	}
	x.marks["invoice/7"][4] = '2' // the disk flips a digit: 34 reads 24
	if o, _ := g.AdmitIn(x, "invoice/7", tok("30")); o.Class != "undecided" || o.Admitted {
		t.Fatalf("damaged: %+v", o)
	}
	x.fail = true
	if o, _ := g.AdmitIn(x, "invoice/7", tok("40")); o.Class != "undecided" || !strings.Contains(o.Reason, "the disk is gone") {
		t.Fatalf("failing store: %+v", o)
	}
}

func TestGoroutinesShareAGuard(t *testing.T) {
	g, err := Open(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	var wg sync.WaitGroup
	for w := 1; w <= 4; w++ {
		wg.Add(1)
		go func(first int) {
			defer wg.Done()
			for n := first; n <= 400; n += 4 {
				o, err := g.Admit("shared", tok(strconv.Itoa(n)))
				if err != nil || (o.Class != "admitted" && o.Class != "stale") {
					t.Errorf("%d: %+v %v", n, o, err)
				}
			}
		}(w)
	}
	wg.Wait()
	if mark, _, _ := g.Mark("shared"); mark != "400" {
		t.Fatalf("mark %q", mark)
	}
}
