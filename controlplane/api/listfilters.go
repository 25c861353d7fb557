package api

import (
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
)

// idCursor reads the cursor of a list paged by a numeric row id (the audit
// log, the outbox, dead letters): 0 for the first page, else the positive
// id the previous page ended on.
func idCursor(cursor string) (int64, error) {
	if cursor == "" {
		return 0, nil
	}
	id, err := strconv.ParseInt(cursor, 10, 64)
	if err != nil || id <= 0 {
		return 0, invalid("page.cursor", "is not a cursor this API returned")
	}
	return id, nil
}

// idString is the cursor form of a row id.
func idString(id int64) string { return strconv.FormatInt(id, 10) }

// timeWindow reads a list's since (inclusive) and until (exclusive); an
// unset bound is the zero time. until must come after since.
func timeWindow(since, until *timestamppb.Timestamp) (from, to time.Time, err error) {
	if since != nil {
		if !since.IsValid() {
			return from, to, invalid("since", "is not a valid time")
		}
		from = since.AsTime()
	}
	if until != nil {
		if !until.IsValid() {
			return from, to, invalid("until", "is not a valid time")
		}
		to = until.AsTime()
	}
	if !from.IsZero() && !to.IsZero() && !to.After(from) {
		return from, to, invalid("until", "must be after since")
	}
	return from, to, nil
}

// checkLengths refuses a text filter longer than max bytes, naming it.
func checkLengths(max int, filters map[string]string) error {
	for field, v := range filters {
		if len(v) > max {
			return invalid(field, "at most %d bytes", max)
		}
	}
	return nil
}
