// The IDX file format of MNIST and Fashion-MNIST, read from a file or from a
// byte buffer, gzip-compressed or not.
//
// Format (http://yann.lecun.com/exdb/mnist/, "THE IDX FILE FORMAT"): a 4-byte
// big-endian magic number 0x0000TTNN, where TT is the element type
// (0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64)
// and NN the number of dimensions; then NN big-endian uint32 sizes; then the
// elements, big-endian, in row-major order. Nothing may follow the elements.
//
// Input starting with the gzip magic bytes 1f 8b is decompressed with zlib
// while it is read (several concatenated gzip members are one stream, as for
// gunzip); anything else is read as a plain IDX file. So Debian's
// dataset-fashion-mnist files (*-idx?-ubyte.gz) are read as shipped, and
// unpacked copies work too.
//
// Memory is bounded: the size that the header declares is checked against
// IdxOptions::max_bytes before anything is allocated, so a forged header
// ("4e9 x 4e9 x 4e9") or a gzip bomb fails with an error, not an allocation.
// Exactly one buffer of the declared size is allocated (the result tensor);
// the decompressor streams into it through a 64 KiB window.
//
// parse_idx() works on an in-memory buffer and does no I/O, for tests and
// fuzzing (libFuzzer: call it on (data, size) with a small max_bytes and
// catch ddp::Error; anything else escaping, or a crash, is a bug).
//
// Thread safety: the functions are reentrant; they share no state.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddp {
namespace datasets {

// IDX element types; the value is the type byte of the magic number.
enum class IdxDtype : uint8_t {
  kUInt8 = 0x08,    // -> at::kByte
  kInt8 = 0x09,     // -> at::kChar
  kInt16 = 0x0B,    // -> at::kShort
  kInt32 = 0x0C,    // -> at::kInt
  kFloat32 = 0x0D,  // -> at::kFloat
  kFloat64 = 0x0E,  // -> at::kDouble
};

// "uint8", "int8", ... ; "unknown" for a value outside the enum.
const char* to_string(IdxDtype dtype);

// Bytes per element of `dtype` (1, 1, 2, 4, 4, 8).
size_t element_size(IdxDtype dtype);

// The IDX magic number for a type and a number of dimensions:
// idx_magic(IdxDtype::kUInt8, 3) == 0x00000803 (MNIST images).
uint32_t idx_magic(IdxDtype dtype, int ndim);

struct IdxOptions {
  // Largest element payload accepted, in bytes: the product of the sizes
  // times the element size, zero sizes skipped (so an empty array with
  // absurd other sizes is rejected too). The default, 1 GiB, is 20x
  // Fashion-MNIST's training images (47,040,000 bytes). Must be > 0.
  size_t max_bytes = size_t{1} << 30;
  // If set, a file whose magic number differs is rejected before its sizes
  // are read: "bad magic number: expected 0x00000803 (uint8, 3 dimensions),
  // got 0x00000801 (uint8, 1 dimension)".
  std::optional<uint32_t> expected_magic;
};

struct IdxArray {
  uint32_t magic = 0;
  IdxDtype dtype = IdxDtype::kUInt8;
  // The sizes from the header, outermost first; empty for a 0-d file.
  std::vector<int64_t> dims;
  // CPU, contiguous, shape `dims`, dtype as listed in IdxDtype, values in
  // host byte order. Owns its memory.
  at::Tensor tensor;
};

// Parses an IDX file held in memory (gzip-compressed or not). `name` is used
// in error messages only (a file name, or "<buffer>"). `data` is only read
// during the call and may be null when `size` is 0.
//
// Throws ddp::InvalidArgument, with a message starting with `name`, for:
//   - a corrupt gzip stream (zlib's message; a CRC or length mismatch);
//   - a gzip stream that ends early ("truncated gzip stream");
//   - a bad magic number (first two bytes not zero, unknown type byte, or
//     not options.expected_magic);
//   - a declared payload larger than options.max_bytes (or overflowing),
//     or a shape libtorch cannot allocate;
//   - fewer bytes than declared ("truncated: expected N bytes, got M",
//     N and M counting the header, after decompression);
//   - bytes after the declared data ("trailing data").
IdxArray parse_idx(const void* data, size_t size, const std::string& name,
                   const IdxOptions& options = {});

// Reads the IDX file at `path` (gzip-compressed or not), streaming it:
// neither the compressed file nor a decompressed copy is held in memory
// besides the result. Throws ddp::InvalidArgument naming `path` for a file
// that is missing or unreadable ("cannot open: No such file or directory"),
// and for every error listed at parse_idx().
IdxArray read_idx_file(const std::string& path, const IdxOptions& options = {});

}  // namespace datasets
}  // namespace ddp
