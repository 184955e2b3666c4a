/* SPDX-License-Identifier: MIT */
/*
 * rooms_check.c - the entry point of the border checks (CMakeLists.txt,
 * shardfs_room_check): the program links one room of the core whole with
 * the rooms below it, so that linking it at all is the check. Never run.
 */
int main(void)
{
    return 0;
}
