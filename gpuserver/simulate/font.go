package simulate

import (
	"image"
	"image/color"
	"unicode"
)

// glyphs is a 3x5 pixel font (upper case, digits and a few signs; lower case is drawn as upper case), enough to
// label a plot with the standard library alone: five rows of three pixels each, '#' set. It is read only.
var glyphs = map[rune]string{
	'A': ".#. #.# ### #.# #.#", 'B': "##. #.# ##. #.# ##.", 'C': ".## #.. #.. #.. .##", 'D': "##. #.# #.# #.# ##.",
	'E': "### #.. ##. #.. ###", 'F': "### #.. ##. #.. #..", 'G': ".## #.. #.# #.# .##", 'H': "#.# #.# ### #.# #.#",
	'I': "### .#. .#. .#. ###", 'J': "..# ..# ..# #.# .#.", 'K': "#.# #.# ##. #.# #.#", 'L': "#.. #.. #.. #.. ###",
	'M': "#.# ### ### #.# #.#", 'N': "##. #.# #.# #.# #.#", 'O': ".#. #.# #.# #.# .#.", 'P': "##. #.# ##. #.. #..",
	'Q': ".#. #.# #.# ##. .##", 'R': "##. #.# ##. #.# #.#", 'S': ".## #.. .#. ..# ##.", 'T': "### .#. .#. .#. .#.",
	'U': "#.# #.# #.# #.# ###", 'V': "#.# #.# #.# #.# .#.", 'W': "#.# #.# ### ### #.#", 'X': "#.# #.# .#. #.# #.#",
	'Y': "#.# #.# .#. .#. .#.", 'Z': "### ..# .#. #.. ###",
	'0': "### #.# #.# #.# ###", '1': ".#. ##. .#. .#. ###", '2': "##. ..# .#. #.. ###", '3': "##. ..# .#. ..# ##.",
	'4': "#.# #.# ### ..# ..#", '5': "### #.. ##. ..# ##.", '6': ".## #.. ### #.# ###", '7': "### ..# .#. .#. .#.",
	'8': "### #.# ### #.# ###", '9': "### #.# ### ..# ##.",
	'.': "... ... ... ... .#.", '-': "... ... ### ... ...", '%': "#.. ..# .#. #.. ..#", '/': "..# ..# .#. #.. #..",
	'(': ".#. #.. #.. #.. .#.", ')': ".#. ..# ..# ..# .#.", ',': "... ... ... .#. #..", ':': "... .#. ... .#. ...",
	' ': "... ... ... ... ...",
}

// textScale is the size of one font pixel in image pixels; a character is 4 font pixels wide with its gap.
const textScale = 2

// textWidth is the width in pixels of s drawn by drawText.
func textWidth(s string) int { return len([]rune(s)) * 4 * textScale }

// drawText draws s with its top left corner at (x, y); characters without a glyph are drawn as spaces.
func drawText(img *image.RGBA, x, y int, s string, c color.RGBA) {
	for _, r := range s {
		g := glyphs[unicode.ToUpper(r)]
		for i, ch := range g {
			if ch != '#' {
				continue
			}
			row, col := i/4, i%4
			fill(img, image.Rect(x+col*textScale, y+row*textScale, x+(col+1)*textScale, y+(row+1)*textScale), c)
		}
		x += 4 * textScale
	}
}
