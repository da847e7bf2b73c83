package demo

import (
	"bytes"
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestScreen_WhatIsWrittenScrollsAboveTheFooter: each write erases the
// footer (cursor up over its lines, erase below), writes its whole lines and
// draws the footer again under them; a line not yet ended waits for its end.
func TestScreen_WhatIsWrittenScrollsAboveTheFooter(t *testing.T) {
	var out bytes.Buffer
	s := NewScreen(&out, 10)
	write := func(text string) {
		_, err := io.WriteString(s, text)
		require.NoError(t, err)
	}
	write("start\n")
	s.SetFooter([]string{"table", "a line longer than the terminal"})
	s.SetFooter([]string{"table", "a line longer than the terminal"}) // unchanged: not drawn again
	write("half a ")
	require.Equal(t, "start\ntable\na line lo\n", out.String(), "a footer line is cut to the width, and half a line waits")
	write("record\n")
	s.SetFooter([]string{"table 2"})
	s.Close()
	write("after\n")
	require.Equal(t, "start\n"+"table\na line lo\n"+
		"\r\x1b[2A\x1b[J"+"half a record\n"+"table\na line lo\n"+
		"\r\x1b[2A\x1b[J"+"table 2\n"+
		"after\n", out.String())
}
