// Package store keeps the relay's runs and their log lines in one bbolt
// file on the relay's volume: run records, lines under a dense per-run
// sequence, each container stream's Cursor (how far it is stored, exact to
// the line), the mirror's progress, and retention. A line and its
// stream's cursor commit in one transaction, which is what makes a resume
// after any crash lose and repeat nothing.
package store
