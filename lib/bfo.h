/* bfo.h: the public interface of libbfo, batch-file operations for big trees of small files.
   The only header users include; every symbol is bfo_* / BFO_*, errors are -errno returns.  */

#ifndef BFO_H
#define BFO_H 1

#ifdef __cplusplus
extern "C" {
#endif

/* The version of the library actually linked, e.g. "0.1.0".  */
const char *bfo_version (void);

/* Features, as bits of the mask bfo_features returns.  */
enum bfo_feature
{
  BFO_FEATURE_IO_URING = 1u << 0,  /* this kernel accepts io_uring_setup */
  BFO_FEATURE_EXT4IMG  = 1u << 1,  /* the libext2fs image backend is built in */
};

/* Probe what this build and this kernel offer; a bitmask of enum bfo_feature.
   Never fails: a feature that cannot be probed is reported absent.  */
unsigned int bfo_features (void);

/* The short name of one feature bit ("io_uring", "ext4img"), or NULL.  */
const char *bfo_feature_name (unsigned int feature);

/* The version of the libext2fs library linked in, e.g. "1.47.0".  */
const char *bfo_ext2fs_version (void);

#ifdef __cplusplus
}
#endif

#endif /* BFO_H */
