package api

import "slices"

// MethodsForTest lists every registered method, by name, with whether it
// is mutating (audited): the fuzz target calls each one.
func MethodsForTest(s *Server) (names []string, mutating map[string]bool) {
	mutating = map[string]bool{}
	for name, m := range s.methods {
		names = append(names, name)
		mutating[name] = m.mutating
	}
	slices.Sort(names)
	return names, mutating
}
