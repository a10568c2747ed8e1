// Package store is what the relay needs of a store (Backend) and what
// every store keeps: run records, lines under a dense per-run sequence,
// each container stream's Cursor (how far it is stored, exact to the
// line), the mirror's progress, and what retention keeps of retired runs.
// A line and its stream's cursor commit in one transaction, and a commit
// only from the cursor its writer read (CursorConflict), which is what
// makes a resume after any crash, or two writers of one stream, lose and
// repeat nothing. The stores sit beside it: bolt (one file, the default)
// and postgres (several replicas).
package store
