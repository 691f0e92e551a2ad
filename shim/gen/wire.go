package main

// wireConst is a constant of the wire format, emitted to both the C and the Go side.
type wireConst struct {
	Name  string
	Value uint64
	Doc   string
}

// wireConsts is the wire format's single list of constants. Changing a layout value is a major version bump.
var wireConsts = []wireConst{
	{"Magic", 0x4D524746, "first word of the hello, its reply and the control block (\"FGRM\" little-endian)"},
	{"VersionMajor", 1, "incompatible changes; a mismatch is refused"},
	{"VersionMinor", 3, "compatible additions (new calls, the instance block); a server accepts clients with minor <= its own"},
	{"RecordHeaderSize", 16, "u32 size, u16 call id, u16 flags, u64 seq"},
	{"RecordFlagSync", 1, "the caller waits for a response (set for sync calls, and for every call in all-sync mode)"},
	{"RecordPadID", 0, "call id of padding up to the end of the ring"},
	{"ResponseHeaderSize", 16, "u64 seq, i32 result, u32 payload size"},
	{"ControlSize", 4096, "bytes of the control block at the start of the shared memory"},
	{"CtlMagic", 0, "u32"},
	{"CtlMajor", 4, "u16"},
	{"CtlMinor", 6, "u16"},
	{"CtlControlSize", 8, "u32"},
	{"CtlRingOffset", 16, "u64"},
	{"CtlRingSize", 24, "u64"},
	{"CtlRespOffset", 32, "u64"},
	{"CtlRespSize", 40, "u64"},
	{"CtlReqTail", 64, "u64 bytes published by the client (own cache line)"},
	{"CtlReqHead", 128, "u64 bytes consumed by the server (own cache line)"},
	{"CtlServerWaiting", 192, "u32 1 while the server sleeps on the socket"},
	{"CtlRespSeq", 256, "u64 seq of the last response written"},
	{"CtlClientWaiting", 320, "u32 1 while the client sleeps on the socket"},
	{"HelloSize", 288, "bytes of the hello message"},
	{"HelloPid", 8, "u32"},
	{"HelloFlags", 12, "u32"},
	{"HelloShmSize", 16, "u64"},
	{"HelloFunction", 24, "char[128] NUL-terminated"},
	{"HelloToken", 152, "char[128] NUL-terminated"},
	{"NameMax", 128, "bytes of the function and token fields"},
	{"HelloFlagInstance", 1, "HelloFlags bit (minor >= 3): the instance block follows the hello"},
	{"HelloInstanceSize", 64, "bytes of the instance block: char[64] NUL-terminated, the instance's name"},
	{"ReplySize", 1592, "bytes of the hello reply"},
	{"ReplyStatus", 8, "i32: a Status"},
	{"ReplyTotalMem", 16, "u64: the function's memory quota"},
	{"ReplyVABase", 24, "u64: start of the device address window"},
	{"ReplyVASize", 32, "u64: size of the device address window"},
	{"ReplyDeviceName", 40, "char[256]"},
	{"ReplyUUID", 296, "u8[16]"},
	{"ReplyAttrs", 312, "i32[256]: device attributes by CUdevice_attribute"},
	{"ReplyMessage", 1336, "char[256]: why a hello was refused"},
	{"AttrCount", 256, "entries of ReplyAttrs"},
	{"StatusOK", 0, "hello accepted"},
	{"StatusVersion", 1, "protocol version not supported"},
	{"StatusIdentity", 2, "function identity not accepted"},
	{"StatusSharedMemory", 3, "shared memory refused"},
	{"StatusInternal", 4, "server failure"},
	{"ParamMax", 128, "most kernel parameters a layout describes"},
}
