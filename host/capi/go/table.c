// The C side of a Go MarkStore: a fencekeeper_mark_store whose callbacks are the Go
// functions exported in fencekeeper.go and whose context is a cgo.Handle.
#include "_cgo_export.h"

fencekeeper_mark_store fencekeeper_go_table(uintptr_t handle) {
    fencekeeper_mark_store table = {0};
    table.ctx = (void *)handle;
    table.get = (fencekeeper_get_fn)fencekeeperGoGet;
    table.compare_and_swap = (fencekeeper_swap_fn)fencekeeperGoSwap;
    table.audit = (fencekeeper_audit_fn)fencekeeperGoAudit;
    table.name = "the Go engine's store";
    return table;
}
