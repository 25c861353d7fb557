package doctor

import "context"

// IDBtreeGist is the check of the database's no-double-booking guard for
// reservations.
const IDBtreeGist = "database.btree-gist"

// BtreeGist checks what keeps a GPU from being reserved twice for
// overlapping time (store ReservationGuard; docs/reservations.md): on
// PostgreSQL the btree_gist extension and the exclusion constraint of
// migration 0015_reservations must both be there, else it fails (the
// placer would still check in its transaction, but concurrent writers
// could double-book); on SQLite the write transaction's check is always
// there.
func BtreeGist(ctx context.Context, st interface {
	ReservationGuard(context.Context) (bool, string, error)
}) Result {
	ok, detail, err := st.ReservationGuard(ctx)
	switch {
	case err != nil:
		return result(IDBtreeGist, Fail, "cannot read the reservation guard: "+err.Error())
	case !ok:
		return result(IDBtreeGist, Fail, "nothing in the database stops a double booking of reservations: run "+
			"CREATE EXTENSION btree_gist as a superuser, then better-compute migrate (migration 0015_reservations)", detail)
	}
	return result(IDBtreeGist, OK, "the database refuses overlapping reservations of a GPU", detail)
}
