//go:build !linux

package doctor

// LocalClock reports that the clock's synchronisation state is read only on
// Linux.
func LocalClock() Result {
	return result(IDClock, "", OK, "the clock's synchronisation state is read only on Linux")
}
