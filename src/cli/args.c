/* Argument checks shared by the subcommands. */
#include <stdio.h>

#include "cli/commands.h"

bool hs_cli_empty_path(const char *cmd, const char *flag, const char *path, const char *fix) {
    if (!path || path[0]) return false;
    fprintf(stderr, "hypershard %s: %s: empty path given; give %s\n", cmd, flag, fix);
    return true;
}
