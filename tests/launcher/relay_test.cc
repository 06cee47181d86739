// The output relay (relay.cc) on a pipe, in process: prefixed whole lines,
// a trailing unterminated line, the stderr tail, the log file.
#include "launcher/relay.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "launcher/process_harness.h"
#include "support/temp_dir.h"

namespace ddp::launcher {
namespace {

using ::testing::ElementsAre;

struct Pipe {
  int fds[2];
  Pipe() {
    EXPECT_EQ(pipe2(fds, O_CLOEXEC), 0);
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
  }
  void write(const std::string& s) { EXPECT_EQ(::write(fds[1], s.data(), s.size()), (ssize_t)s.size()); }
};

// Relays `chunks` written one by one through an OutputStream whose console
// is another pipe; returns what reached that console.
std::string relay(StreamRoute route, const std::vector<std::string>& chunks,
                  std::vector<std::string>* tail = nullptr) {
  Pipe in, console;
  fcntl(console.fds[0], F_SETFL, O_NONBLOCK);
  route.console_fd = console.fds[1];
  OutputStream s(in.fds[0], route);
  for (const std::string& c : chunks) {
    in.write(c);
    s.read_available();
  }
  close(in.fds[1]);
  s.drain();
  EXPECT_FALSE(s.is_open());  // end of stream seen
  if (tail) *tail = s.tail();
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(console.fds[0], buf, sizeof(buf))) > 0) out.append(buf, n);
  close(console.fds[0]);
  close(console.fds[1]);
  return out;
}

TEST(LauncherRelay, PrefixesWholeLinesOnly) {
  StreamRoute r;
  r.prefix = "[rank3]:";
  EXPECT_EQ(relay(r, {"hel", "lo\nwor", "ld\n\nlast"}),
            "[rank3]:hello\n[rank3]:world\n[rank3]:\n[rank3]:last\n");
}

TEST(LauncherRelay, WithoutPrefixBytesPassAsTheyCome) {
  StreamRoute r;
  EXPECT_EQ(relay(r, {"50%\r", "100%\r\n", "no newline"}), "50%\r100%\r\nno newline");
}

// Note [Carriage-return updates]: on a terminal, "\r" pieces are drawn in
// place with the prefix, and the owner's newline ends the line; "\r\n" is
// a line end, also split across reads.
TEST(LauncherRelay, CarriageReturnUpdatesAreDrawnInPlaceOnATerminal) {
  StreamRoute r;
  r.prefix = "[rank0]:";
  r.terminal = true;
  EXPECT_EQ(relay(r, {"epoch 1 [#.] 1/2\r", "epoch 1 [##] 2/2\r", "\n", "done\n"}),
            "\r[rank0]:epoch 1 [#.] 1/2\x1b[K\r[rank0]:epoch 1 [##] 2/2\x1b[K\n"
            "[rank0]:done\n");
  EXPECT_EQ(relay(r, {"a\r\nb\r", "\nc"}), "[rank0]:a\n\r[rank0]:b\x1b[K\n[rank0]:c\n");
  // "\r<bar>" (ddp-train's way): each bar is drawn when it arrives, not
  // when the next "\r" ends it; a bar split across reads is redrawn whole.
  EXPECT_EQ(relay(r, {"\rstep 1", "\rstep 2", "\rst", "ep 3", "\n"}),
            "\r[rank0]:step 1\x1b[K\r[rank0]:step 2\x1b[K\r[rank0]:st\x1b[K"
            "\r[rank0]:step 3\x1b[K\r[rank0]:step 3\x1b[K\n");
  // Not a terminal: "\r" is part of the line.
  r.terminal = false;
  EXPECT_EQ(relay(r, {"50%\r100%\n"}), "[rank0]:50%\r100%\n");
}

// Another rank's line clears the open bar, is written, and the bar is
// redrawn below it; the bar's owner ending its stream ends the line.
TEST(LauncherRelay, AnotherRanksLineNeverMixesIntoAnOpenBar) {
  Pipe bar_in, other_in, console;
  fcntl(console.fds[0], F_SETFL, O_NONBLOCK);
  StreamRoute r0, r1;
  r0.prefix = "[rank0]:";
  r1.prefix = "[rank1]:";
  r0.terminal = r1.terminal = true;
  r0.console_fd = r1.console_fd = console.fds[1];
  {
    OutputStream bar(bar_in.fds[0], r0), other(other_in.fds[0], r1);
    bar_in.write("step 1\r");
    bar.read_available();
    other_in.write("hello\n");
    other.read_available();
    bar_in.write("step 2\r");
    bar.read_available();
    close(bar_in.fds[1]);
    bar.drain();
    close(other_in.fds[1]);
    other.drain();
  }
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(console.fds[0], buf, sizeof(buf))) > 0) out.append(buf, n);
  EXPECT_EQ(out,
            "\r[rank0]:step 1\x1b[K"
            "\r\x1b[K[rank1]:hello\n\r[rank0]:step 1\x1b[K"
            "\r[rank0]:step 2\x1b[K\n");
  close(console.fds[0]);
  close(console.fds[1]);
}

TEST(LauncherRelay, KeepsTheLastLinesForTheSummary) {
  StreamRoute r;
  r.tail_lines = 2;
  std::vector<std::string> tail;
  relay(r, {"a\nb\n", "c\nd"}, &tail);
  EXPECT_THAT(tail, ElementsAre("c", "d"));
}

TEST(LauncherRelay, LogFileGetsTheRawBytes) {
  testing::TempDir dir;
  StreamRoute r;
  r.prefix = "[rank0]:";
  r.log_path = dir.file("stdout.log");
  relay(r, {"x\n", "y"});
  EXPECT_EQ(testing::read_text(dir.file("stdout.log")), "x\ny");
}

TEST(LauncherRelay, UnwritableLogFileIsNamed) {
  Pipe in;
  StreamRoute r;
  r.log_path = "/nonexistent-dir/x/stdout.log";
  try {
    OutputStream s(in.fds[0], r);
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("could not create log file "
                                               "'/nonexistent-dir/x/stdout.log'"));
  }
  close(in.fds[1]);
}

}  // namespace
}  // namespace ddp::launcher
