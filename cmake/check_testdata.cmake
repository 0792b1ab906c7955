# cmake -DDIR=PATH -P check_testdata.cmake: ctest's test_testdata, the
# fixture every test that reads the shared test data requires. When the
# folder is missing, this one test fails with what to do, and ctest does
# not run the others (each would fail on its own "no such file").
foreach(sub models vocab golden templates)
  if(NOT IS_DIRECTORY "${DIR}/${sub}")
    # lines that start with a space are printed as they are (no reflow)
    message(FATAL_ERROR
      "the shared test data is not at ${DIR} (no ${sub}/ there).\n"
      " The tests read reference models, vocabularies, golden outputs and templates\n"
      " from the folder KETTLE_TESTDATA names (default: ../shared beside the repository).\n"
      " Point it at that folder and configure again:\n"
      "   cmake -S . -B build -DKETTLE_TESTDATA=/path/to/shared\n"
      " (or set the environment variable KETTLE_TESTDATA before the first configure).\n"
      " The tests that need no such data run without it; those that do are not run.")
  endif()
endforeach()
message(STATUS "shared test data: ${DIR}")
