// The master-port check and free ports (net.cc).
#include "launcher/net.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ddp/error.h"

namespace ddp::launcher {
namespace {

using ::testing::HasSubstr;

TEST(LauncherNet, ListeningPortIsReportedBusyWithItsNumber) {
  int port = pick_free_port();
  EXPECT_EQ(port_unavailable_reason(port), "");
  int fd = listen_on(port);
  EXPECT_EQ(port_unavailable_reason(port), "Address already in use");
  try {
    check_master_port(port);
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("--master-port " + std::to_string(port) + " cannot be used"));
  }
  EXPECT_THROW(listen_on(port), InvalidArgument);
  close(fd);
  EXPECT_EQ(port_unavailable_reason(port), "");
}

TEST(LauncherNet, AcceptedConnectionsDoNotHoldThePort) {
  // Node 0's launcher accepts the other launchers on --master-port, then
  // closes its listener so that rank 0's TCPStore can bind the port while
  // those connections stay up.
  int port = pick_free_port();
  int listener = listen_on(port);
  std::string error;
  int client = connect_to("127.0.0.1", port, 1000, error);
  ASSERT_GE(client, 0) << error;
  int accepted = accept(listener, nullptr, nullptr);
  ASSERT_GE(accepted, 0);
  close(listener);
  EXPECT_EQ(port_unavailable_reason(port), "");
  int store = listen_on(port);
  EXPECT_EQ(write(accepted, "x", 1), 1);  // the old connection still works
  char c = 0;
  pollfd p{client, POLLIN, 0};
  poll(&p, 1, 1000);
  EXPECT_EQ(read(client, &c, 1), 1);
  EXPECT_EQ(c, 'x');
  close(store);
  close(accepted);
  close(client);
}

TEST(LauncherNet, ConnectErrorsAreReported) {
  int port = pick_free_port();  // nothing listens there
  std::string error;
  EXPECT_EQ(connect_to("127.0.0.1", port, 1000, error), -1);
  EXPECT_EQ(error, "Connection refused");
  EXPECT_EQ(connect_to("no-such-host.invalid", port, 1000, error), -1);
  EXPECT_THAT(error, HasSubstr("cannot resolve 'no-such-host.invalid'"));
  int listener = listen_on(port);
  int fd = connect_to("127.0.0.1", port, 1000, error);
  EXPECT_GE(fd, 0) << error;
  close(fd);
  close(listener);
}

}  // namespace
}  // namespace ddp::launcher
