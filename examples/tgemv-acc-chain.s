# y1 = y0 + x1 W1: C = T#4, D -> T#1
BSTART.TGEMV.ACC BF16
B.FPATR None, None, 0, 0, 0, 0, 0, 0, 0
B.DIM zero, 4, ->LB1
B.DIM zero, 3, ->LB2
B.IOT T#4, M#1, mask=1111
B.IOT N#1, mask=1111, last, ->T<256B>
# y2 = y1 + x2 W2: C = T#1 (selector 0) with D -> M (hand 2): legal; D -> M#3
BSTART.TGEMV.ACC BF16
B.FPATR None, None, 0, 0, 0, 0, 0, 0, 0
B.DIM zero, 4, ->LB1
B.DIM zero, 3, ->LB2
B.IOT T#1, M#2, mask=1111
B.IOT N#2, mask=1111, last, ->M<256B>
# C = T#1 (selector 0) with D -> T (hand 0): the C/D index rule faults
BSTART.TGEMV.ACC BF16
B.FPATR None, None, 0, 0, 0, 0, 0, 0, 0
B.DIM zero, 4, ->LB1
B.DIM zero, 3, ->LB2
B.IOT T#1, M#2, mask=1111
B.IOT N#2, mask=1111, last, ->T<256B>
BSTOP
