package sandboxtoml

import (
	"bytes"
	"errors"

	"github.com/BurntSushi/toml"
)

// locator finds where a key is written. The decoder records a position for
// every key but only shows it in a ParseError, so the locator decodes the
// value of a key into a type whose UnmarshalTOML always fails and reads the
// position off that error.
type locator struct {
	md   toml.MetaData
	root map[string]toml.Primitive
	data []byte
	// counts is how often each key occurs; a key inside an array of tables
	// occurs once per table and the decoder remembers only the last.
	counts map[string]int
}

func newLocator(decoded toml.MetaData, data []byte) *locator {
	l := &locator{data: data, counts: map[string]int{}}
	for _, k := range decoded.Keys() {
		l.counts[k.String()]++
	}
	md, err := toml.NewDecoder(bytes.NewReader(data)).Decode(&l.root)
	if err != nil {
		// The same bytes decoded once already; positions are a courtesy.
		return l
	}
	l.md = md
	return l
}

// errHere makes the decoder report the position of the value it was given.
var errHere = errors.New("position probe")

type probe struct{}

func (probe) UnmarshalTOML(any) error { return errHere }

// position returns the 1-based line and column of key, or of its nearest
// enclosing key that is written in the file. index is the array element the
// caller means, or -1; when the key occurs in several tables of an array and
// index is not the last one, no position is given rather than a wrong one.
func (l *locator) position(key toml.Key, index int) (int, int) {
	if l == nil || l.root == nil {
		return 0, 0
	}
	for n := len(key); n > 0; n-- {
		k := key[:n]
		count := l.counts[k.String()]
		if count == 0 {
			continue
		}
		if index >= 0 && count > 1 && index != count-1 {
			return 0, 0
		}
		prim, ok := l.walk(k)
		if !ok {
			continue
		}
		var pe toml.ParseError
		if err := l.md.PrimitiveDecode(prim, probe{}); !errors.As(err, &pe) {
			continue
		}
		return pe.Position.Line, keyColumn(l.data, pe.Position.Start, k[len(k)-1])
	}
	return 0, 0
}

// walk finds the primitive value of key, descending through tables and,
// for arrays of tables, the last table that holds the next key.
func (l *locator) walk(key toml.Key) (toml.Primitive, bool) {
	cur, ok := l.root[key[0]]
	if !ok {
		return toml.Primitive{}, false
	}
	for _, name := range key[1:] {
		// The decoder leaves a map nil, without error, when the value is
		// an array of tables rather than a table.
		var table map[string]toml.Primitive
		if err := l.md.PrimitiveDecode(cur, &table); err == nil && table != nil {
			if cur, ok = table[name]; !ok {
				return toml.Primitive{}, false
			}
			continue
		}
		var tables []map[string]toml.Primitive
		if err := l.md.PrimitiveDecode(cur, &tables); err != nil {
			return toml.Primitive{}, false
		}
		found := false
		for j := len(tables) - 1; j >= 0; j-- {
			if p, ok := tables[j][name]; ok {
				cur, found = p, true
				break
			}
		}
		if !found {
			return toml.Primitive{}, false
		}
	}
	return cur, true
}

// keyColumn turns the offset the decoder recorded for a key into the
// column of the key itself. The decoder records the key's own offset inside
// inline tables, and the offset of the value elsewhere ("  target = ..."
// gives the column of "target"); a table header or a value on a line of its
// own keeps its own column.
func keyColumn(data []byte, start int, name string) int {
	if start > len(data) {
		start = len(data)
	}
	lineStart := bytes.LastIndexByte(data[:start], '\n') + 1
	if rest, ok := bytes.CutPrefix(data[start:], []byte(name)); ok && bytes.HasPrefix(bytes.TrimLeft(rest, " \t"), []byte("=")) {
		return start - lineStart + 1
	}
	prefix := data[lineStart:start]
	eq := bytes.LastIndexByte(prefix, '=')
	if eq < 0 {
		return start - lineStart + 1
	}
	end := eq
	for end > 0 && (prefix[end-1] == ' ' || prefix[end-1] == '\t') {
		end--
	}
	begin := end
	for begin > 0 && !bytes.ContainsRune([]byte(" \t{,["), rune(prefix[begin-1])) {
		begin--
	}
	return begin + 1
}

// lineColumn is the 1-based line and column of a byte offset. The
// decoder's own line count has already moved past a newline it stopped at,
// which would point below the line at fault.
func lineColumn(data []byte, start int) (int, int) {
	if start > len(data) {
		start = len(data)
	}
	lineStart := bytes.LastIndexByte(data[:start], '\n') + 1
	return bytes.Count(data[:start], []byte{'\n'}) + 1, start - lineStart + 1
}
